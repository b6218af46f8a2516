// The official `@anthropic-ai/sdk` npm client against `reprise serve` on the
// real stories260K model from ../shared: the Messages API created and
// streamed (the client's own accumulator), cache reads on a repeated
// conversation, a forced tool call answered with its result, token
// counting, model listing and error mapping. Run through run.sh.
import { test } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { adapterModel, model, serveForTests, skipReason } from "./reprise_server.mjs";

const apiKey = "test-key-456";
const skip = skipReason("Anthropic client");
let client;
serveForTests({ skip, apiKey, onReady: (url) => {
  client = new Anthropic({ baseURL: url, apiKey, maxRetries: 0, timeout: 60000 });
} });

const system = "You tell short stories.";
const messages = [{ role: "user", content: "Once upon a time" }];

test("messages: created and streamed alike, with cache reads", { skip }, async () => {
  const body = { model, system, messages, max_tokens: 16, temperature: 0 };
  const m = await client.messages.create(body);
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.content[0].type, "text");
  assert.ok(m.content[0].text.length > 0);
  assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason), m.stop_reason);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 16);

  const texts = [];
  const stream = client.messages.stream(body);
  stream.on("text", (t) => texts.push(t));
  const streamed = await stream.finalMessage();
  assert.equal(texts.join(""), m.content[0].text);
  assert.deepEqual(streamed.content, m.content);
  assert.equal(streamed.stop_reason, m.stop_reason);
  // The same prompt ran just before: all of it but its last token is read from the cache.
  assert.ok(streamed.usage.cache_read_input_tokens > 0, JSON.stringify(streamed.usage));
  assert.equal(streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens,
               m.usage.input_tokens + m.usage.cache_read_input_tokens);

  const counted = await client.messages.countTokens({ model, system, messages });
  assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test("messages: a forced tool call answered with its result", { skip }, async () => {
  const tools = [{
    name: "add", description: "Adds two integers",
    input_schema: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                    required: ["a", "b"], additionalProperties: false },
  }];
  const m = await client.messages.create({
    model, messages, tools, tool_choice: { type: "tool", name: "add" }, max_tokens: 200, temperature: 0.7, seed: 2,
  });
  assert.equal(m.stop_reason, "tool_use");
  const call = m.content.find((b) => b.type === "tool_use");
  assert.ok(call, JSON.stringify(m.content));
  assert.equal(call.name, "add");
  assert.ok(Number.isInteger(call.input.a) && Number.isInteger(call.input.b), JSON.stringify(call.input));
  const next = await client.messages.create({
    model, tools, max_tokens: 8, temperature: 0,
    messages: [...messages, { role: "assistant", content: m.content },
               { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "3" }] }],
  });
  assert.equal(next.role, "assistant");
});

test("messages: errors map to the client's exception types", { skip }, async () => {
  await assert.rejects(client.messages.create({ model: "no-such-model", messages, max_tokens: 4 }),
                       (e) => e instanceof Anthropic.NotFoundError && e.status === 404);
  await assert.rejects(client.messages.create({ model, messages: [], max_tokens: 4 }),
                       (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === "invalid_request_error");
  const wrongKey = new Anthropic({ baseURL: client.baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create({ model, messages, max_tokens: 4 }),
                       (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
});

test("models: the client lists the served model and its LoRA adapter", { skip }, async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    assert.equal(m.type, "model");
    assert.ok(!Number.isNaN(Date.parse(m.created_at)), m.created_at);
    ids.push(m.id);
  }
  assert.deepEqual(ids, [model, adapterModel]);  // the adapter is a model to clients
});
