// The official `openai` npm client against `reprise serve` on the real
// stories260K model from ../shared: chat completions streamed and not,
// n choices, the Responses API, embeddings, text completions (a batch of prompts with echo), usage (with cached prompt tokens on a repeated request),
// structured output (response_format, checked with ajv and the client's own
// zod helper), a LoRA adapter as a model and through the `lora` field, model
// listing and error mapping. Run through run.sh, which installs the
// client and finds the reprise binary.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import Ajv from "ajv";
import { z } from "zod";
import { adapterModel, model, serveForTests, skipReason } from "./reprise_server.mjs";

const apiKey = "test-key-123";
const skip = skipReason("OpenAI client");
let client;
serveForTests({ skip, apiKey, onReady: (url) => {
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
} });

const messages = [
  { role: "system", content: "You tell short stories." },
  { role: "user", content: "Once upon a time" },
];

function checkUsage(usage) {
  assert.ok(usage, "usage is present");
  assert.ok(usage.prompt_tokens > 0);
  assert.ok(usage.completion_tokens > 0);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.equal(typeof usage.prompt_tokens_details.cached_tokens, "number");
}

test("chat completion, not streamed", { skip }, async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, model);
  const choice = r.choices[0];
  assert.equal(choice.message.role, "assistant");
  assert.equal(typeof choice.message.content, "string");
  assert.ok(choice.message.content.length > 0, "text is non-empty");
  assert.ok(["stop", "length"].includes(choice.finish_reason), choice.finish_reason);
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 32);
});

test("chat completion, streamed, with usage; matches the non-streamed text", { skip }, async () => {
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  let sawRole = false;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role === "assistant") sawRole = true;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.ok(sawRole, "a chunk carries the assistant role");
  assert.ok(text.length > 0, "streamed text is non-empty");
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  checkUsage(usage);
  // The same prompt ran just before: its tokens come from the prefix cache.
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, "repeated prompt is served from the cache");
});

test("repeated chat request reports cached prompt tokens", { skip }, async () => {
  const body = { model, messages: [{ role: "user", content: "Tom had a red ball." }], max_tokens: 8, temperature: 0 };
  const first = await client.chat.completions.create(body);
  const second = await client.chat.completions.create(body);
  checkUsage(first.usage);
  checkUsage(second.usage);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 1,
            JSON.stringify(second.usage));
  assert.equal(second.choices[0].message.content, first.choices[0].message.content);
});

test("n choices: the client's stream helper assembles each, as the whole reply has them", { skip }, async () => {
  const body = { model, messages, max_tokens: 16, temperature: 1.0, seed: 11, n: 3 };
  const whole = await client.chat.completions.create(body);
  assert.equal(whole.choices.length, 3);
  whole.choices.forEach((c, i) => assert.equal(c.index, i));
  const runner = client.chat.completions.stream(body);
  const assembled = await runner.finalChatCompletion();
  assert.equal(assembled.choices.length, 3);
  for (const c of assembled.choices) {
    assert.equal(c.message.content, whole.choices[c.index].message.content, `choice ${c.index}`);
    assert.equal(c.finish_reason, whole.choices[c.index].finish_reason);
  }
  checkUsage(whole.usage);
});

test("text completion continues the story", { skip }, async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.match(r.choices[0].text, /little girl named Lily/);
  assert.equal(r.choices[0].finish_reason, "length");
  checkUsage(r.usage);
});

test("a batch of prompts with echo and logprobs, as evaluation harnesses send it", { skip }, async () => {
  const prompts = ["Once upon a time", "Lily and Ben"];
  const r = await client.completions.create({ model, prompt: prompts, echo: true, logprobs: 1, max_tokens: 0 });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.text, prompts[c.index]);
    const lp = c.logprobs;
    assert.ok(lp.tokens.length >= 2, JSON.stringify(lp));
    assert.equal(lp.token_logprobs[0], null);
    assert.ok(lp.token_logprobs.slice(1).every((v) => typeof v === "number" && v <= 0));
    assert.equal(lp.text_offset.length, lp.tokens.length);
  }
  assert.equal(r.usage.completion_tokens, 0);
});

test("stop strings end the text before the match", { skip }, async () => {
  const r = await client.completions.create({
    model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, stop: ["Lily"],
  });
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.ok(!r.choices[0].text.includes("Lily"));
  assert.match(r.choices[0].text, /named $/);
});

test("models are listed, the LoRA adapter among them", { skip }, async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model, adapterModel]);  // the adapter is a model to clients
});

test("a LoRA adapter is a model of its own, or the lora field of a request", { skip }, async () => {
  const listed = await client.models.list();
  const entry = listed.data.find((m) => m.id === adapterModel);
  assert.ok(entry, "the adapter is listed");
  assert.equal(entry.parent, model);
  const ask = { messages, max_tokens: 16, temperature: 0, logprobs: true };
  const base = await client.chat.completions.create({ model, ...ask });
  const adapted = await client.chat.completions.create({ model: adapterModel, ...ask });
  assert.equal(adapted.model, adapterModel);
  assert.notDeepEqual(adapted.choices[0].logprobs, base.choices[0].logprobs, "the adapter changes the reply");
  // llama.cpp's per-request field, passed through by the client as given.
  const byField = await client.chat.completions.create({ model, ...ask, lora: [{ id: 0, scale: 1 }] });
  assert.deepEqual(byField.choices[0].logprobs, adapted.choices[0].logprobs);
  assert.ok(byField.usage.prompt_tokens_details.cached_tokens > 0, "the same adapter shares its cached prompt");
  await assert.rejects(
    client.chat.completions.create({ model, ...ask, lora: [{ id: "nope" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "lora[0].id");
});

test("errors map to the client's exception types", { skip }, async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 4 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === "model_not_found");
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 4 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages");
  const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

// Structured output: a 260K-parameter story model knows no JSON, so the
// documents it writes come from the constraint alone; an independent
// validator (ajv) checks each finished one against the schema.
test("response_format json_schema: replies validate with ajv", { skip }, async () => {
  const schema = {
    type: "object",
    properties: {
      hero: { type: "string", minLength: 1, maxLength: 10 },
      age: { type: "integer" },
      mood: { enum: ["happy", "sad"] },
      friends: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 2 },
    },
    required: ["hero", "age", "mood"],
    additionalProperties: false,
  };
  const validate = new Ajv().compile(schema);
  let finished = 0;
  for (let seed = 1; seed <= 8; ++seed) {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: 120, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "story", schema, strict: true } },
    });
    const { content } = r.choices[0].message;
    if (r.choices[0].finish_reason !== "stop") continue;
    finished += 1;
    const doc = JSON.parse(content);
    assert.ok(validate(doc), `${content}: ${JSON.stringify(validate.errors)}`);
  }
  assert.ok(finished >= 6, `${finished} of 8 replies finished`);
});

test("response_format from the client's zod helper parses", { skip }, async () => {
  const Story = z.object({ title: z.string().max(12), pages: z.number().int().min(1).max(500), done: z.boolean() });
  const r = await client.chat.completions.parse({
    model, messages, max_tokens: 80, temperature: 0.8, seed: 3,
    response_format: zodResponseFormat(Story, "story"),
  });
  const parsed = r.choices[0].message.parsed;
  assert.ok(parsed, r.choices[0].message.content);
  assert.deepEqual(Object.keys(parsed).sort(), ["done", "pages", "title"]);
  assert.ok(Story.safeParse(parsed).success);
});

test("response_format json_object streams an object", { skip }, async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, stream: true, response_format: { type: "json_object" },
  });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? "";
  assert.ok(text.startsWith("{"), text);
});

test("unsupported schema keywords are a 400 naming the parameter", { skip }, async () => {
  await assert.rejects(
    client.chat.completions.create({
      model, messages, max_tokens: 4,
      response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "(?=a)a+" } } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema" &&
           e.message.includes("pattern"));
});

test("tool_choice required: the client reads message.tool_calls", { skip }, async () => {
  const tools = [{
    type: "function",
    function: {
      name: "add", description: "Adds two integers",
      parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                    required: ["a", "b"], additionalProperties: false },
    },
  }];
  const r = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", max_tokens: 200, temperature: 0.7, seed: 2,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  const [call] = choice.message.tool_calls;
  assert.equal(call.function.name, "add");
  const args = JSON.parse(call.function.arguments);
  assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b), call.function.arguments);
  // The call goes back as an assistant turn with a tool result, as agents send it.
  const next = await client.chat.completions.create({
    model, max_tokens: 8, temperature: 0, tools,
    messages: [...messages, choice.message, { role: "tool", tool_call_id: call.id, content: "3" }],
  });
  assert.equal(next.choices[0].message.role, "assistant");
});

// The Responses API through the client's own methods: create (whole and
// streamed through its event accumulator), a conversation continued with
// previous_response_id, structured output, a forced function call answered
// with function_call_output, retrieve, input items and delete.
test("responses: create, stream and continue a conversation", { skip }, async () => {
  const body = { model, instructions: "You tell short stories.", input: "Once upon a time", max_output_tokens: 16,
                 temperature: 0 };
  const r = await client.responses.create(body);
  assert.equal(r.object, "response");
  assert.ok(["completed", "incomplete"].includes(r.status), r.status);
  assert.equal(r.output[0].type, "message");
  assert.ok(r.output_text.length > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

  // Streamed: the client's accumulator builds the same message; the
  // ending event (response.incomplete when max_output_tokens cut it, as
  // OpenAI sends it) carries the Response with its usage.
  const deltas = [];
  let ended = null;
  const stream = client.responses.stream(body);
  stream.on("response.output_text.delta", (e) => deltas.push(e.delta));
  for (const type of ["response.completed", "response.incomplete"]) stream.on(type, (e) => (ended = e.response));
  const streamed = await stream.finalResponse();
  assert.equal(deltas.join(""), r.output_text);
  assert.equal(streamed.output[0].content[0].text, r.output_text);
  assert.equal(ended.status, r.status);
  assert.equal(ended.output_text, r.output_text);
  assert.ok(ended.usage.input_tokens_details.cached_tokens > 0, "the repeated prompt came from the cache");

  const next = await client.responses.create({
    model, previous_response_id: r.id, input: "Then", max_output_tokens: 8, temperature: 0,
  });
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
  assert.ok(next.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(next.usage));

  const again = await client.responses.retrieve(r.id);
  assert.equal(again.output_text, r.output_text);
  const items = [];
  for await (const item of client.responses.inputItems.list(r.id)) items.push(item);
  assert.equal(items.length, 1);
  assert.equal(items[0].content[0].text, "Once upon a time");
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(
    client.responses.create({ model, previous_response_id: r.id, input: "x" }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === "previous_response_not_found");
});

test("responses: json_schema output and a function call answered by its output", { skip }, async () => {
  const schema = { type: "object", properties: { hero: { type: "string", maxLength: 12 } }, required: ["hero"],
                   additionalProperties: false };
  const structured = await client.responses.create({
    model, input: "Name the hero.", max_output_tokens: 60, temperature: 0.7, seed: 3,
    text: { format: { type: "json_schema", name: "story", schema, strict: true } },
  });
  const ajv = new Ajv();
  assert.ok(ajv.validate(schema, JSON.parse(structured.output_text)), structured.output_text);

  const tools = [{ type: "function", name: "add", description: "Adds two integers", strict: true,
                   parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                                 required: ["a", "b"], additionalProperties: false } }];
  const call = await client.responses.create({
    model, input: "Add two numbers.", tools, tool_choice: "required", max_output_tokens: 200, temperature: 0.7, seed: 2,
  });
  const fc = call.output.find((item) => item.type === "function_call");
  assert.ok(fc, JSON.stringify(call.output));
  assert.equal(fc.name, "add");
  const args = JSON.parse(fc.arguments);
  assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b), fc.arguments);
  const answered = await client.responses.create({
    model, previous_response_id: call.id, tools, max_output_tokens: 8, temperature: 0,
    input: [{ type: "function_call_output", call_id: fc.call_id, output: String(args.a + args.b) }],
  });
  assert.equal(answered.output.at(-1).type, "message");
  await assert.rejects(
    client.responses.create({ model, input: "x", tools: [{ type: "web_search" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[0].type");
});

// Embeddings: the client asks for base64 by default and decodes it; both
// encodings give the same unit-length vectors, one per input.
test("embeddings: a batch, base64 (the client's default) and float", { skip }, async () => {
  const input = ["Once upon a time", "Lily and Ben"];
  const r = await client.embeddings.create({ model, input });
  assert.equal(r.object, "list");
  assert.equal(r.data.length, 2);
  const floats = await client.embeddings.create({ model, input, encoding_format: "float" });
  for (const [i, item] of r.data.entries()) {
    assert.equal(item.index, i);
    assert.equal(item.embedding.length, floats.data[i].embedding.length);
    item.embedding.forEach((v, k) => assert.ok(Math.abs(v - floats.data[i].embedding[k]) < 1e-7));
    const norm = Math.sqrt(item.embedding.reduce((s, v) => s + v * v, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5, String(norm));
  }
  assert.ok(floats.usage.prompt_tokens > 0);
  const cut = await client.embeddings.create({ model, input: input[0], dimensions: 8, encoding_format: "float" });
  assert.equal(cut.data[0].embedding.length, 8);
});
