// The Responses API (POST /v1/responses): the request read as a chat
// completion, the output items and streamed events a Response is built
// from, the store behind previous_response_id, and the endpoint end to end
// on synthetic models — including the differential that a conversation
// continued from the store (its earlier turns read from the prefix cache)
// replies exactly as the same conversation sent whole to a cold server.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "server/choice_stream.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/responses_request.h"
#include "json_mutation.h"
#include "test_server.h"

using namespace reprise;
using nlohmann::json;
using nlohmann::ordered_json;
using test::scripted_reply_request;
using test::serve_with_template;
using test::Server;

namespace {

ResponsesRequest parse_ok(const json& body) {
  Parsed<ResponsesRequest> r = parse_responses_request(body.dump());
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? r.value() : ResponsesRequest{};
}

ApiError parse_error(const json& body) {
  Parsed<ResponsesRequest> r = parse_responses_request(body.dump());
  EXPECT_FALSE(r.ok()) << body.dump();
  return r.ok() ? ApiError{} : r.error();
}

ChatCompletionRequest chat_of(const json& body, const ordered_json& history = ordered_json::array()) {
  Parsed<ChatCompletionRequest> chat = responses_chat_request(parse_ok(body), history);
  EXPECT_TRUE(chat.ok()) << chat.error().message;
  return chat.ok() ? std::move(chat.value()) : ChatCompletionRequest{};
}

}  // namespace

TEST(ResponsesRequest, InputItemsBecomeChatMessages) {
  // A string is one user message; instructions lead as a system message.
  ChatCompletionRequest simple = chat_of({{"input", "Hi"}, {"instructions", "Be brief."}});
  EXPECT_EQ(json::parse(simple.messages.dump()),
            json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])"));

  // Items: text parts, an assistant turn with its calls, their outputs
  // (named after the call), reasoning carried to the next assistant turn.
  const json body = json::parse(R"({"input":[
      {"role":"developer","content":"Use tools."},
      {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather?"},{"type":"input_text","text":"In Oslo."}]},
      {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Call it."}]},
      {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking.","annotations":[]}]},
      {"type":"function_call","call_id":"call_a","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},
      {"type":"function_call","call_id":"call_b","name":"get_time","arguments":"{}"},
      {"type":"function_call_output","call_id":"call_a","output":"Sunny"},
      {"type":"function_call_output","call_id":"call_b","output":[{"type":"input_text","text":"Noon"}]},
      {"role":"user","content":"Thanks"}]})");
  ChatCompletionRequest chat = chat_of(body);
  const json expected = json::parse(R"([
      {"role":"system","content":"Use tools."},
      {"role":"user","content":"Weather?\nIn Oslo."},
      {"role":"assistant","content":"Checking.","reasoning_content":"Call it.","tool_calls":[
          {"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},
          {"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
      {"role":"tool","content":"Sunny","tool_call_id":"call_a","name":"get_weather"},
      {"role":"tool","content":"Noon","tool_call_id":"call_b","name":"get_time"},
      {"role":"user","content":"Thanks"}])");
  EXPECT_EQ(json::parse(chat.messages.dump()), expected);
  // Input items are listed back with ids (reasoning items are not listed).
  const ResponsesRequest request = parse_ok(body);
  ASSERT_EQ(request.input_items.size(), 8u);
  for (const auto& item : request.input_items) EXPECT_TRUE(item["id"].is_string()) << item.dump();
  EXPECT_EQ(request.input_items[0]["type"], "message");

  // A stored conversation goes between the instructions and the new input.
  const ordered_json history = ordered_json::parse(
      R"([{"role":"user","content":"Earlier"},{"role":"assistant","content":"Reply"}])");
  ChatCompletionRequest continued = chat_of({{"input", "Next"}, {"instructions", "Sys"}}, history);
  EXPECT_EQ(json::parse(continued.messages.dump()),
            json::parse(R"([{"role":"system","content":"Sys"},{"role":"user","content":"Earlier"},
                            {"role":"assistant","content":"Reply"},{"role":"user","content":"Next"}])"));
}

TEST(ResponsesRequest, OptionsMapToTheirChatCompletionsForms) {
  const json body = json::parse(R"({"input":"x","max_output_tokens":7,"temperature":0.5,"top_p":0.9,"seed":4,
      "tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object","properties":{}},"strict":true}],
      "tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false,
      "reasoning":{"effort":"low"},"include":["message.output_text.logprobs"],"top_logprobs":3,
      "cache_salt":"tenant","metadata":{"k":"v"},"store":false,"stream":true})");
  const ResponsesRequest request = parse_ok(body);
  EXPECT_FALSE(request.store);
  EXPECT_EQ(request.cache_salt, "tenant");
  EXPECT_EQ(request.echoed["max_output_tokens"], 7);
  EXPECT_EQ(request.echoed["metadata"], ordered_json({{"k", "v"}}));
  EXPECT_EQ(request.echoed["tools"], ordered_json(body["tools"]));
  ChatCompletionRequest chat = chat_of(body);
  EXPECT_EQ(chat.options.max_tokens, 7);
  EXPECT_FLOAT_EQ(chat.options.sampling.temperature, 0.5f);
  EXPECT_EQ(chat.options.sampling.seed, 4u);
  EXPECT_TRUE(chat.options.logprobs);
  EXPECT_EQ(chat.options.top_logprobs, 3);
  EXPECT_EQ(chat.options.cache_salt, "tenant");
  EXPECT_TRUE(chat.options.tool_call_reply);  // a named function forces the call
  EXPECT_FALSE(chat.parallel_tool_calls);
  EXPECT_EQ(chat.tools[0]["function"]["name"], "f");
  EXPECT_EQ(chat.tools[0]["function"]["strict"], true);
  EXPECT_EQ(chat.template_kwargs["reasoning_effort"], "low");

  ChatCompletionRequest structured = chat_of(json::parse(R"({"input":"x","text":{"format":{"type":"json_schema",
      "name":"n","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},"strict":true}}})"));
  ASSERT_TRUE(structured.options.json_schema);
  EXPECT_TRUE(chat_of({{"input", "x"}, {"text", {{"format", {{"type", "json_object"}}}}}}).options.json_schema);
  EXPECT_FALSE(chat_of({{"input", "x"}, {"text", {{"format", {{"type", "text"}}}}}}).options.json_schema);
  // Chat-only fields are not read from a Responses body.
  ChatCompletionRequest ignored =
      chat_of({{"input", "x"}, {"n", 3}, {"messages", "not read"}, {"max_tokens", 2}, {"response_format", 1}});
  EXPECT_EQ(ignored.options.choices, 1);
  EXPECT_FALSE(ignored.options.max_tokens);
}

TEST(ResponsesRequest, WhatCannotBeHonouredIsRefusedByItsName) {
  auto param_of = [](const json& body) { return parse_error(body).param; };
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}), "tools[0].type");
  EXPECT_EQ(param_of({{"input", {{{"type", "item_reference"}, {"id", "msg_1"}}}}}), "input[0].type");
  EXPECT_EQ(param_of({{"input", {{{"role", "user"}, {"content", {{{"type", "input_file"}, {"file_id", "f"}}}}}}}}),
            "input[0].content[0].type");
  EXPECT_EQ(param_of({{"input", {{{"role", "user"},
                                  {"content", {{{"type", "input_image"}, {"file_id", "f"}}}}}}}}),
            "input[0].content[0].file_id");
  EXPECT_EQ(param_of({{"input", "x"}, {"background", true}}), "background");
  EXPECT_EQ(param_of({{"input", "x"}, {"conversation", "conv_1"}}), "conversation");
  EXPECT_EQ(param_of({{"input", "x"}, {"tool_choice", {{"type", "allowed_tools"}}}}), "tool_choice.type");
  EXPECT_EQ(param_of({{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}}}}}}),
            "text.format.schema");
  EXPECT_EQ(param_of({{"input", "x"}, {"max_output_tokens", 0}}), "max_output_tokens");
  EXPECT_EQ(param_of(json::object()), "input");
  EXPECT_EQ(param_of({{"input", json::array()}}), "input");
  EXPECT_EQ(param_of({{"input", {{{"role", "tool"}, {"content", "x"}}}}}), "input[0].role");
  EXPECT_EQ(param_of({{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}),
            "input[0].call_id");
  EXPECT_EQ(param_of({{"input", "x"}, {"metadata", {{"k", 1}}}}), "metadata");
  EXPECT_EQ(parse_error(R"([1])").status, 400);
  EXPECT_FALSE(parse_responses_request("{").ok());
  // Errors the chat parser finds are named as the Responses API names them.
  Parsed<ChatCompletionRequest> schema_error = responses_chat_request(
      parse_ok(json::parse(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n",
          "schema":{"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}}}}})")),
      ordered_json::array());
  ASSERT_FALSE(schema_error.ok());
  EXPECT_EQ(schema_error.error().param.rfind("text.format", 0), 0u) << schema_error.error().param;
  Parsed<ChatCompletionRequest> temperature =
      responses_chat_request(parse_ok({{"input", "x"}, {"temperature", 3}}), ordered_json::array());
  ASSERT_FALSE(temperature.ok());
  EXPECT_EQ(temperature.error().param, "temperature");
}

// Mutations of valid bodies: each parses (and reads as a chat request) or
// is refused with a 4xx; nothing throws.
TEST(ResponsesRequest, MutationFuzz) {
  const std::vector<std::string> seeds = {
      R"({"input":"hi","instructions":"s","max_output_tokens":5,"stream":true,"store":false})",
      R"({"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:x"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"},{"type":"reasoning","summary":[{"type":"summary_text","text":"r"}]}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":"auto"})",
      R"({"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object","properties":{"a":{"type":"string"}}}}},"include":["message.output_text.logprobs"],"top_logprobs":2,"metadata":{"a":"b"},"reasoning":{"effort":"high"},"previous_response_id":"resp_x"})",
  };
  const std::vector<json> values = {nullptr, true, 0, -1, 7, 1e300, "", "x", json::array(), json::object(),
                                    json::array({1, "a"}), json::object({{"type", "message"}}),
                                    json::object({{"type", "function_call"}}), json::object({{"role", "user"}})};
  const std::vector<std::string> keys = {"input", "type", "role", "content", "text", "call_id", "name", "arguments",
                                         "output", "tools", "tool_choice", "format", "schema", "include", "summary",
                                         "instructions", "max_output_tokens", "image_url", "metadata", "store"};
  std::mt19937_64 rng(77);
  test::JsonMutator mutator(rng, values, keys);
  auto pick = [&](size_t n) { return mutator.pick(n); };
  int parsed = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    json doc = json::parse(seeds[pick(seeds.size())]);
    for (int m = 0, n = 1 + static_cast<int>(pick(3)); m < n; ++m) mutator.mutate(doc);
    std::string body = doc.dump();
    if (pick(5) == 0) body.resize(pick(body.size() + 1));
    Parsed<ResponsesRequest> r = parse_responses_request(body);
    if (!r.ok()) {
      EXPECT_GE(r.error().status, 400);
      EXPECT_LT(r.error().status, 500);
      continue;
    }
    Parsed<ChatCompletionRequest> chat = responses_chat_request(r.value(), ordered_json::array());
    if (chat.ok()) ++parsed;
    else EXPECT_EQ(chat.error().status, 400) << body;
  }
  EXPECT_GT(parsed, 100);
}

namespace {

// A Responses stream read as OpenAI's SDK reads it (its ResponseStream's
// checks), failing the test where the SDK would throw: the first event is
// response.created with no output; sequence numbers count from 0; items
// are announced in order; parts and deltas name announced items and parts
// of their kind; the last event ends the response. Returns the final
// Response, with the texts the deltas built.
struct ReadStream {
  json response;
  std::string reasoning, text, arguments;
  std::vector<std::string> types;
};

ReadStream read_stream(const std::string& body) {
  ReadStream out;
  std::vector<json> events;
  std::istringstream lines(body);
  std::string event_name;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("event: ", 0) == 0) event_name = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    EXPECT_NE(line, "data: [DONE]");
    json e = json::parse(line.substr(6), nullptr, false);
    EXPECT_FALSE(e.is_discarded()) << line;
    EXPECT_EQ(e.value("type", ""), event_name);
    events.push_back(std::move(e));
  }
  EXPECT_FALSE(events.empty());
  if (events.empty()) return out;
  EXPECT_EQ(events.front()["type"], "response.created");
  EXPECT_EQ(events.front()["response"]["output"], json::array());
  json output = json::array();
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    const std::string type = e["type"];
    out.types.push_back(type);
    EXPECT_EQ(e["sequence_number"], i) << type;
    if (type == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], output.size());
      output.push_back(e["item"]);
      continue;
    }
    if (!e.contains("output_index")) continue;
    const size_t index = e["output_index"];
    EXPECT_LT(index, output.size()) << "missing output at index " << index;
    if (index >= output.size()) continue;
    json& item = output[index];
    if (type == "response.content_part.added") {
      EXPECT_EQ(e["content_index"], item["content"].size());
      EXPECT_EQ(e["part"]["text"], "");
      item["content"].push_back(e["part"]);
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      const size_t part = e["content_index"];
      EXPECT_LT(part, item["content"].size()) << "missing content";
      if (part >= item["content"].size()) continue;
      const bool text = type == "response.output_text.delta";
      EXPECT_EQ(item["content"][part]["type"], text ? "output_text" : "reasoning_text");
      EXPECT_EQ(item["type"], text ? "message" : "reasoning");
      (text ? out.text : out.reasoning) += e["delta"].get<std::string>();
      if (text) {
        EXPECT_TRUE(e["logprobs"].is_array());
      }
    } else if (type == "response.function_call_arguments.delta") {
      EXPECT_EQ(item["type"], "function_call");
      out.arguments += e["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.done") {
      EXPECT_EQ(e["name"], item["name"]);
    }
  }
  const std::string last = events.back()["type"];
  EXPECT_TRUE(last == "response.completed" || last == "response.incomplete" || last == "response.failed") << last;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    EXPECT_EQ(events[i]["type"].get<std::string>().find("response.completed"), std::string::npos);
  out.response = events.back()["response"];
  EXPECT_EQ(out.response["output"].size(), output.size());
  return out;
}

// A Response's output items with their ids left out (ids are fresh each time).
json without_ids(json output) {
  for (json& item : output) item.erase("id");
  return output;
}

}  // namespace

TEST(ResponseBuilder, EventsAnnounceItemsAndPartsBeforeTheirDeltas) {
  std::string events;
  const ordered_json shell = {{"id", "resp_1"}, {"created_at", 1}, {"model", "m"}};
  ResponseBuilder streamed(shell, &events);
  ResponseBuilder whole(shell, nullptr);
  for (ResponseBuilder* b : {&streamed, &whole}) {
    b->start();
    b->reasoning("Think", std::nullopt);
    b->reasoning("ing.", std::nullopt);
    b->content("Hel", std::vector<LogprobEntry>{{"Hel", -0.5f, {}, true}});
    b->content("lo", std::vector<LogprobEntry>{{"lo", -0.25f, {}, true}});
    b->tool_calls({{"call_1", "f", "{\"a\":1}"}, {"call_2", "g", "{}"}}, std::nullopt);
    b->finish("tool_calls");
  }
  GenerationOutcome usage;
  usage.usage = UsageCounts{10, 4, 6};
  const ordered_json final_response = streamed.complete(usage, 2);
  const ordered_json whole_response = whole.complete(usage, 2);
  ReadStream read = read_stream(events);
  EXPECT_EQ(read.reasoning, "Thinking.");
  EXPECT_EQ(read.text, "Hello");
  EXPECT_EQ(read.arguments, "{\"a\":1}{}");
  EXPECT_EQ(json::parse(final_response.dump()), read.response);
  EXPECT_EQ(without_ids(read.response["output"]), without_ids(json::parse(whole_response["output"].dump())));
  const json& output = read.response["output"];
  ASSERT_EQ(output.size(), 4u);
  EXPECT_EQ(output[0]["type"], "reasoning");
  EXPECT_EQ(output[0]["content"][0]["text"], "Thinking.");
  EXPECT_EQ(output[1]["content"][0]["text"], "Hello");
  EXPECT_EQ(output[1]["content"][0]["logprobs"].size(), 2u);
  EXPECT_EQ(output[2]["call_id"], "call_1");
  EXPECT_EQ(output[3]["name"], "g");
  EXPECT_EQ(read.response["output_text"], "Hello");
  EXPECT_EQ(read.response["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(read.response["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(read.response["usage"]["total_tokens"], 16);
  EXPECT_EQ(json::parse(streamed.assistant_message().dump()),
            json::parse(R"({"role":"assistant","content":"Hello","reasoning_content":"Thinking.","tool_calls":[
                {"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},
                {"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]})"));

  // Cut short: incomplete, the message item too; a reply of nothing is an
  // empty message; a failure is response.failed.
  std::string cut_events;
  ResponseBuilder cut(shell, &cut_events);
  cut.start();
  cut.content("Par", std::nullopt);
  cut.finish("length");
  const ordered_json incomplete = cut.complete(usage, 0);
  EXPECT_EQ(incomplete["status"], "incomplete");
  EXPECT_EQ(incomplete["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(incomplete["output"][0]["status"], "incomplete");
  EXPECT_EQ(read_stream(cut_events).types.back(), "response.incomplete");
  ResponseBuilder thinking(shell, nullptr);
  thinking.reasoning("Hmm", std::nullopt);
  thinking.finish("length");
  const ordered_json cut_thinking = thinking.complete(usage, 1);
  ASSERT_EQ(cut_thinking["output"].size(), 1u);
  EXPECT_EQ(cut_thinking["output"][0]["type"], "reasoning");
  EXPECT_EQ(cut_thinking["output"][0]["status"], "incomplete");
  ResponseBuilder empty(shell, nullptr);
  empty.finish("stop");
  const ordered_json nothing = empty.complete(usage, 0);
  ASSERT_EQ(nothing["output"].size(), 1u);
  EXPECT_EQ(nothing["output"][0]["content"][0]["text"], "");
  std::string failed_events;
  ResponseBuilder failed(shell, &failed_events);
  failed.start();
  failed.content("x", std::nullopt);
  const ordered_json failure = failed.fail(ApiError::server("boom"));
  EXPECT_EQ(failure["status"], "failed");
  EXPECT_EQ(failure["error"]["code"], "server_error");
  EXPECT_EQ(read_stream(failed_events).types.back(), "response.failed");
}

TEST(ResponseStore, ChainsScopesAndEvictsByBytes) {
  auto turn = [](const std::string& id, const std::string& previous, const std::string& salt, size_t pad = 0) {
    StoredResponse r;
    r.id = id;
    r.previous_response_id = previous;
    r.cache_salt = salt;
    r.response = ordered_json{{"id", id}, {"pad", std::string(pad, 'p')}}.dump();
    r.messages = ordered_json::array({{{"role", "user"}, {"content", "q" + id}},
                                      {{"role", "assistant"}, {"content", "a" + id}}})
                     .dump();
    return r;
  };
  ResponseStore store(64 * 1024);
  store.put(turn("r1", "", "s"));
  store.put(turn("r2", "r1", "s"));
  store.put(turn("r3", "r2", "s"));
  const std::optional<ordered_json> conversation = store.conversation("r3", "s");
  ASSERT_TRUE(conversation);
  ASSERT_EQ(conversation->size(), 6u);
  EXPECT_EQ((*conversation)[0]["content"], "qr1");
  EXPECT_EQ((*conversation)[5]["content"], "ar3");
  // Another tenant sees nothing.
  EXPECT_FALSE(store.conversation("r3", "other"));
  EXPECT_FALSE(store.get("r1", ""));
  EXPECT_FALSE(store.erase("r1", "other"));
  // A deleted turn breaks the chains that continue it.
  EXPECT_TRUE(store.erase("r2", "s"));
  EXPECT_FALSE(store.conversation("r3", "s"));
  EXPECT_TRUE(store.conversation("r1", "s"));

  // Bytes are bounded: the least recently used go first; reading a
  // conversation marks its whole chain used.
  ResponseStore small(20 * 1024);
  small.put(turn("a1", "", "", 4000));
  small.put(turn("a2", "a1", "", 4000));
  small.put(turn("b1", "", "", 4000));
  ASSERT_TRUE(small.conversation("a2", ""));  // a1, a2 now more recent than b1
  small.put(turn("c1", "", "", 4000));
  small.put(turn("c2", "c1", "", 4000));
  EXPECT_LE(small.bytes(), 20u * 1024);
  EXPECT_FALSE(small.get("b1", ""));
  EXPECT_TRUE(small.get("c2", ""));
  EXPECT_TRUE(small.conversation("a2", ""));
  // One response larger than the whole budget is not kept.
  small.put(turn("huge", "", "", 30000));
  EXPECT_FALSE(small.get("huge", ""));
  EXPECT_LE(small.bytes(), 20u * 1024);
}

namespace {

// A synthetic thinking model whose added tokens let scripted replies write
// reasoning, text and a Hermes tool call.
const std::string kThought = "<think>Two and two.</think>\n\nFour.@@";
const std::string kThenCall =
    "<think>Use the tool.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
    "</tool_call>@@";
constexpr int32_t kIdThought = 598, kIdThenCall = 599;

ServeOptions thinking_server() {
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.user_defined_tokens = {kThought, kThenCall};
  return serve_with_template(
      "responses-thinking", spec,
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
      "</think>{% endif %}{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}"
      "{{ c.function.arguments }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
      "{% if tools %}Call tools as <tool_call>{...}</tool_call>.{% endif %}<|im_start|>assistant\n");
}

// A Responses body that makes the model write the scripted token `id`.
json scripted_response_request(const std::string& question, int32_t id, bool stream = false) {
  json chat = scripted_reply_request(question, {{id, 100}}, stream);
  chat.erase("messages");
  chat.erase("max_tokens");
  chat["input"] = question;
  chat["max_output_tokens"] = 4;
  return chat;
}

const json kFlatWeatherTool = json::parse(R"([{"type": "function", "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])");

std::string post_raw(const Server& s, const json& body) {
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/responses", body.dump(), "application/json");
  return r ? r->body : "";
}

}  // namespace

TEST(ResponsesApi, ReasoningTextAndCallsBecomeOutputItems) {
  Server s(thinking_server());
  auto [st, r] = s.post("/v1/responses", scripted_response_request("Two and two?", kIdThought));
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Two and two.");
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Four.");
  EXPECT_EQ(r["output_text"], "Four.");
  EXPECT_EQ(r["usage"]["output_tokens"], 1);
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 1);
  EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["input_tokens"].get<int>() + 1);

  // Streamed: the same items, through events the SDK accepts.
  ReadStream read = read_stream(post_raw(s, scripted_response_request("Two and two?", kIdThought, true)));
  EXPECT_EQ(read.reasoning, "Two and two.");
  EXPECT_EQ(read.text, "Four.");
  EXPECT_EQ(without_ids(read.response["output"]), without_ids(r["output"]));
  EXPECT_EQ(read.response["status"], "completed");

  // A call in the model's syntax: a function_call item (and its reasoning).
  json with_tools = scripted_response_request("Weather in Rome?", kIdThenCall);
  with_tools["tools"] = kFlatWeatherTool;
  auto [st2, r2] = s.post("/v1/responses", with_tools);
  ASSERT_EQ(st2, 200) << r2.dump();
  ASSERT_EQ(r2["output"].size(), 2u) << r2.dump();
  EXPECT_EQ(r2["output"][0]["type"], "reasoning");
  const json& call = r2["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json({{"city", "Rome"}}));
  EXPECT_EQ(call["status"], "completed");
  EXPECT_TRUE(call["call_id"].is_string() && !call["call_id"].get<std::string>().empty());
  EXPECT_EQ(r2["tools"], kFlatWeatherTool);
  with_tools["stream"] = true;
  ReadStream read2 = read_stream(post_raw(s, with_tools));
  EXPECT_EQ(without_ids(read2.response["output"]).size(), 2u);
  EXPECT_EQ(json::parse(read2.arguments), json({{"city", "Rome"}}));
  EXPECT_EQ(read2.response["output"][1]["name"], "get_weather");

  // The call's result continues the stored conversation: the template
  // sees the earlier turn (with its call) and the tool's output.
  json answer = {{"previous_response_id", r2["id"]},
                 {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "Sunny"}}}},
                 {"tools", kFlatWeatherTool},
                 {"max_output_tokens", 2},
                 {"temperature", 0}};
  auto [st3, r3] = s.post("/v1/responses", answer);
  ASSERT_EQ(st3, 200) << r3.dump();
  EXPECT_EQ(r3["previous_response_id"], r2["id"]);
  EXPECT_GT(r3["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << r3.dump();
}

// The cache differential: a conversation continued with
// previous_response_id (its earlier turns reused from the prefix cache)
// gives exactly what the same conversation sent whole to a cold server
// gives — the same text, token log-probabilities and input token count —
// and what Chat Completions gives for the same messages.
TEST(ResponsesApi, ContinuedConversationsEqualColdRuns) {
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  ServeOptions options = serve_with_template(
      "responses-plain", spec,
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n");
  Server warm(options);
  std::mt19937_64 rng(20261128);
  const std::vector<std::string> words = {"red", "fox", "jumps", "over", "lazy", "dog", "sky", "river", "stone"};
  auto sentence = [&] {
    std::string s;
    for (size_t i = 0, n = 2 + rng() % 6; i < n; ++i) s += (i ? " " : "") + words[rng() % words.size()];
    return s;
  };
  for (int round = 0; round < 4; ++round) {
    const std::string instructions = "You are terse.", first = sentence(), second = sentence();
    json sampling = {{"temperature", round % 2 ? 0.9 : 0.0},
                     {"seed", round},
                     {"include", {"message.output_text.logprobs"}},
                     {"top_logprobs", 2}};
    json turn1 = sampling;
    turn1["instructions"] = instructions;
    turn1["input"] = first;
    turn1["max_output_tokens"] = 1 + static_cast<int>(rng() % 8);
    auto [st1, r1] = warm.post("/v1/responses", turn1);
    ASSERT_EQ(st1, 200) << r1.dump();
    json turn2 = sampling;
    turn2["instructions"] = instructions;
    turn2["previous_response_id"] = r1["id"];
    turn2["input"] = second;
    turn2["max_output_tokens"] = 6;
    auto [st2, r2] = warm.post("/v1/responses", turn2);
    ASSERT_EQ(st2, 200) << r2.dump();
    EXPECT_GT(r2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << r2.dump();

    // The same conversation whole, on a server that has never seen it.
    Server cold(options);
    json whole = sampling;
    whole["instructions"] = instructions;
    whole["input"] = json::array({{{"role", "user"}, {"content", first}}});
    for (const json& item : r1["output"]) whole["input"].push_back(item);
    whole["input"].push_back({{"role", "user"}, {"content", second}});
    whole["max_output_tokens"] = 6;
    auto [st3, r3] = cold.post("/v1/responses", whole);
    ASSERT_EQ(st3, 200) << r3.dump();
    EXPECT_EQ(r3["usage"]["input_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(r3["usage"]["input_tokens"], r2["usage"]["input_tokens"]);
    EXPECT_EQ(r3["output_text"], r2["output_text"]) << "round " << round;
    EXPECT_EQ(r3["output"][0]["content"][0]["logprobs"], r2["output"][0]["content"][0]["logprobs"]);

    // Chat Completions, the same messages: the same reply.
    json chat = {{"messages",
                  {{{"role", "system"}, {"content", instructions}},
                   {{"role", "user"}, {"content", first}},
                   {{"role", "assistant"}, {"content", r1["output_text"]}},
                   {{"role", "user"}, {"content", second}}}},
                 {"temperature", sampling["temperature"]},
                 {"seed", round},
                 {"max_tokens", 6}};
    auto [st4, r4] = cold.post("/v1/chat/completions", chat);
    ASSERT_EQ(st4, 200) << r4.dump();
    EXPECT_EQ(r4["choices"][0]["message"]["content"], r2["output_text"]);
  }
}

TEST(ResponsesApi, StoredResponsesAreScopedToTheirSaltAndCanBeDeleted) {
  ServeOptions options = thinking_server();
  options.responses_ram_mib = 0.02;  // ~20 KiB: a handful of responses
  Server s(options);
  json first = scripted_response_request("Two and two?", kIdThought);
  first["cache_salt"] = "tenant-a";
  auto [st, r] = s.post("/v1/responses", first);
  ASSERT_EQ(st, 200) << r.dump();
  const std::string id = r["id"];
  httplib::Client c("127.0.0.1", s.port);

  // Another tenant (or none) cannot read or continue it.
  EXPECT_EQ(c.Get("/v1/responses/" + id)->status, 404);
  EXPECT_EQ(c.Get("/v1/responses/" + id + "?cache_salt=tenant-b")->status, 404);
  json other = {{"input", "More"}, {"previous_response_id", id}, {"cache_salt", "tenant-b"}, {"max_output_tokens", 1}};
  auto [st2, r2] = s.post("/v1/responses", other);
  EXPECT_EQ(st2, 400);  // OpenAI's status for previous_response_not_found
  EXPECT_EQ(r2["error"]["param"], "previous_response_id");
  EXPECT_EQ(r2["error"]["code"], "previous_response_not_found");

  // Its tenant can: the stored Response, its input items, its continuation.
  auto got = c.Get("/v1/responses/" + id + "?cache_salt=tenant-a");
  ASSERT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body), r);
  auto items = c.Get("/v1/responses/" + id + "/input_items?cache_salt=tenant-a");
  ASSERT_EQ(items->status, 200);
  const json list = json::parse(items->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["content"][0]["text"], "Two and two?");
  EXPECT_EQ(list["first_id"], list["data"][0]["id"]);
  EXPECT_FALSE(list["has_more"]);
  other["cache_salt"] = "tenant-a";
  EXPECT_EQ(s.post("/v1/responses", other).first, 200);

  // DELETE removes it (for its tenant only).
  EXPECT_EQ(c.Delete("/v1/responses/" + id + "?cache_salt=tenant-b")->status, 404);
  auto deleted = c.Delete("/v1/responses/" + id + "?cache_salt=tenant-a");
  ASSERT_EQ(deleted->status, 200);
  EXPECT_EQ(json::parse(deleted->body), json::parse(R"({"id":")" + id + R"(","object":"response.deleted","deleted":true})"));
  EXPECT_EQ(c.Get("/v1/responses/" + id + "?cache_salt=tenant-a")->status, 404);

  // store: false keeps nothing.
  json unstored = scripted_response_request("Two and two?", kIdThought);
  unstored["store"] = false;
  auto [st3, r3] = s.post("/v1/responses", unstored);
  ASSERT_EQ(st3, 200);
  EXPECT_EQ(r3["store"], false);
  EXPECT_EQ(c.Get("/v1/responses/" + r3["id"].get<std::string>())->status, 404);

  // The budget holds a few: the oldest are evicted, the newest kept.
  std::vector<std::string> ids;
  for (int i = 0; i < 30; ++i) {
    auto [sti, ri] = s.post("/v1/responses", scripted_response_request("Two and two?", kIdThought));
    ASSERT_EQ(sti, 200);
    ids.push_back(ri["id"]);
  }
  EXPECT_EQ(c.Get("/v1/responses/" + ids.back())->status, 200);
  EXPECT_EQ(c.Get("/v1/responses/" + ids.front())->status, 404);
  auto [st4, r4] = s.post("/v1/responses", {{"input", "x"}, {"previous_response_id", ids.front()}});
  EXPECT_EQ(st4, 400);
  EXPECT_EQ(r4["error"]["code"], "previous_response_not_found");

  // A conversation that lost an earlier turn says which.
  auto [sta, ra] = s.post("/v1/responses", scripted_response_request("Two and two?", kIdThought));
  json second = scripted_response_request("Two and two?", kIdThought);
  second["previous_response_id"] = ra["id"];
  auto [stb, rb] = s.post("/v1/responses", second);
  ASSERT_EQ(stb, 200) << rb.dump();
  ASSERT_EQ(c.Delete("/v1/responses/" + ra["id"].get<std::string>())->status, 200);
  auto [stc, rc] = s.post("/v1/responses", {{"input", "x"}, {"previous_response_id", rb["id"]}});
  EXPECT_EQ(stc, 400);
  EXPECT_NE(rc["error"]["message"].get<std::string>().find(ra["id"].get<std::string>()), std::string::npos)
      << rc.dump();

  // DELETE takes no body (cpp-httplib would read and inflate it whole).
  httplib::Headers gzip = {{"Content-Encoding", "gzip"}};
  auto with_body = c.Delete("/v1/responses/" + rb["id"].get<std::string>(), gzip, "xxxx", "application/json");
  ASSERT_TRUE(with_body);
  EXPECT_EQ(with_body->status, 400);

  // Input items are listed as the server read them (its own ids, typed
  // parts, nothing else the client sent), page by page.
  json items_request = scripted_response_request("unused", kIdThought);
  items_request["input"] = json::parse(R"([{"role":"user","content":"a","id":"x","bulk":[1,2,3]},
      {"role":"user","content":"b","id":"x"},{"role":"user","content":[{"type":"input_text","text":"c"}],"id":"x"}])");
  auto [std_, rd] = s.post("/v1/responses", items_request);
  ASSERT_EQ(std_, 200) << rd.dump();
  std::vector<std::string> seen;
  std::string after;
  for (int page = 0; page < 5; ++page) {
    auto got_page = c.Get("/v1/responses/" + rd["id"].get<std::string>() + "/input_items?order=asc&limit=1" +
                          (after.empty() ? "" : "&after=" + after));
    ASSERT_EQ(got_page->status, 200);
    const json body = json::parse(got_page->body);
    ASSERT_EQ(body["data"].size(), 1u);
    const json& item = body["data"][0];
    EXPECT_FALSE(item.contains("bulk"));
    EXPECT_NE(item["id"], "x");
    EXPECT_EQ(item["status"], "completed");
    seen.push_back(item["content"][0]["text"]);
    after = item["id"];
    if (!body["has_more"]) break;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));

  // A prompt the context cannot hold is named as the input.
  json too_long = {{"input", std::string(200000, 'y')}, {"max_output_tokens", 1}};
  auto [ste, re] = s.post("/v1/responses", too_long);
  EXPECT_EQ(ste, 400);
  EXPECT_EQ(re["error"]["param"], "input") << re.dump();
  EXPECT_EQ(re["error"]["message"].get<std::string>().find("messages"), std::string::npos) << re.dump();

  // Requests that cannot be served are refused with the field named.
  auto [st5, r5] = s.post("/v1/responses", {{"input", "x"}, {"tools", {{{"type", "file_search"}}}}});
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(r5["error"]["param"], "tools[0].type");
}
