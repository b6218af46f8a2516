// Anthropic's Messages API (POST /v1/messages): the request read as a chat
// completion, the message and its streamed events, and the endpoint on
// synthetic models — thinking, tool use, stop sequences, errors in
// Anthropic's shape, x-api-key, count_tokens, and the differential that a
// conversation whose earlier turns come from the cache replies as a cold
// server does.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "server/messages_output.h"
#include "server/messages_request.h"
#include "test_server.h"

using namespace reprise;
using nlohmann::json;
using test::scripted_reply_request;
using test::serve_with_template;
using test::Server;

namespace {

MessagesRequest parse_ok(const json& body) {
  Parsed<MessagesRequest> r = parse_messages_request(body.dump());
  EXPECT_TRUE(r.ok()) << body.dump() << ": " << r.error().message;
  return r.ok() ? std::move(r.value()) : MessagesRequest{};
}

std::string error_param(const json& body) {
  Parsed<MessagesRequest> r = parse_messages_request(body.dump());
  EXPECT_FALSE(r.ok()) << body.dump();
  return r.ok() ? "<ok>" : r.error().param;
}

}  // namespace

TEST(MessagesRequest, BlocksBecomeChatMessages) {
  const json body = json::parse(R"({"model":"m","max_tokens":64,
      "system":[{"type":"text","text":"Use tools."},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
      "messages":[
        {"role":"user","content":[{"type":"text","text":"Weather?"},
                                  {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]},
        {"role":"assistant","content":[{"type":"thinking","thinking":"Call it.","signature":"s"},
                                       {"type":"text","text":"Checking."},
                                       {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"Sunny"}]},
                                  {"type":"text","text":"Thanks"}]}],
      "tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
      "tool_choice":{"type":"auto","disable_parallel_tool_use":true},
      "stop_sequences":["END"],"temperature":0.5,"top_k":7,"thinking":{"type":"enabled","budget_tokens":1024}})");
  const MessagesRequest r = parse_ok(body);
  const ChatCompletionRequest& chat = r.chat;
  json messages = json::parse(chat.messages.dump());
  ASSERT_EQ(messages.size(), 5u) << messages.dump();
  EXPECT_EQ(messages[0], json::parse(R"({"role":"system","content":"Use tools.\nBe brief."})"));
  EXPECT_EQ(messages[1]["role"], "user");
  EXPECT_EQ(chat.images.size(), 1u);
  EXPECT_EQ(chat.images[0].url, "data:image/png;base64,iVBO");
  EXPECT_EQ(messages[2]["reasoning_content"], "Call it.");
  EXPECT_EQ(messages[2]["content"], "Checking.");
  EXPECT_EQ(messages[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(json::parse(messages[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}}));
  EXPECT_EQ(messages[3], json::parse(R"({"role":"tool","content":"Sunny","tool_call_id":"toolu_1"})"));
  EXPECT_EQ(messages[4], json::parse(R"({"role":"user","content":"Thanks"})"));
  EXPECT_EQ(chat.options.max_tokens, 64);
  EXPECT_EQ(chat.options.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(chat.options.sampling.temperature, 0.5f);
  EXPECT_EQ(chat.options.sampling.top_k, 7);
  EXPECT_FALSE(chat.parallel_tool_calls);
  EXPECT_EQ(chat.tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(chat.template_kwargs["enable_thinking"], true);

  // tool_choice any/tool force a call; none leaves the reply free.
  json forced = {{"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", body["tools"]}};
  forced["tool_choice"] = {{"type", "any"}};
  EXPECT_TRUE(parse_ok(forced).chat.options.tool_call_reply);
  forced["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  EXPECT_TRUE(parse_ok(forced).chat.options.tool_call_reply);
  forced["tool_choice"] = {{"type", "none"}};
  EXPECT_TRUE(parse_ok(forced).chat.tool_choice_none);
}

TEST(MessagesRequest, ResultsStructuredOutputAndPrefills) {
  // A failed tool result says so; its images follow the tool messages in a
  // user message of their own.
  const json body = json::parse(R"({"max_tokens":8,"messages":[
      {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"shot","input":{}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[
          {"type":"text","text":"partial"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]},
        {"type":"text","text":"Go on"}]}]})");
  MessagesRequest r = parse_ok(body);
  json messages = json::parse(r.chat.messages.dump());
  ASSERT_EQ(messages.size(), 4u) << messages.dump();
  EXPECT_EQ(messages[1]["content"], "Error: partial");
  EXPECT_EQ(messages[2]["role"], "user");
  EXPECT_EQ(r.tool_image_messages, std::vector<size_t>{2});
  ASSERT_EQ(r.chat.images.size(), 1u);
  // For a model that reads no images, a tool's image becomes "[image]";
  // the user's own images are left for the model to refuse.
  EXPECT_TRUE(drop_tool_result_images(r));
  EXPECT_TRUE(r.chat.images.empty());
  EXPECT_FALSE(r.chat.first_image_message);
  EXPECT_EQ(json::parse(r.chat.messages.dump())[2]["content"], "[image]");
  json own = body;
  own["messages"][1]["content"].push_back(
      json::parse(R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}})"));
  MessagesRequest with_own = parse_ok(own);
  EXPECT_FALSE(drop_tool_result_images(with_own));
  EXPECT_EQ(with_own.chat.images.size(), 2u);

  // output_config.format is structured output; thinking adaptive is on.
  json structured = {{"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                     {"output_config", {{"format", {{"type", "json_schema"}, {"schema", {{"type", "object"}}}}}}},
                     {"thinking", {{"type", "adaptive"}}}};
  const MessagesRequest s = parse_ok(structured);
  EXPECT_TRUE(s.chat.options.json_schema);
  EXPECT_EQ(s.chat.template_kwargs["enable_thinking"], true);

  // A final assistant message is continued.
  json prefill = {{"max_tokens", 8},
                  {"messages", {{{"role", "user"}, {"content", "JSON please"}},
                                {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "{\"a\":"}}}}}}}};
  const MessagesRequest p = parse_ok(prefill);
  EXPECT_TRUE(p.chat.continue_final_message);
  EXPECT_EQ(json::parse(p.chat.messages.dump()).back()["content"], "{\"a\":");

  // Chat completions ask for the same with continue_final_message, which
  // needs a final assistant message with text.
  Parsed<ChatCompletionRequest> not_assistant = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})");
  ASSERT_FALSE(not_assistant.ok());
  EXPECT_EQ(not_assistant.error().param, "continue_final_message");
  EXPECT_TRUE(parse_chat_completion_request(R"({"messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":"y"}],"continue_final_message":true})")
                  .value()
                  .continue_final_message);

  // A tool schema as deep as the body allows still reads as chat (which
  // nests it one level deeper).
  json deep = {{"type", "object"}};
  std::string deep_body;
  for (int i = 0; json_nesting_depth(deep_body, 1000) < 64; ++i) {
    deep = {{"type", "object"}, {"properties", {{"x", deep}}}};
    const json candidate = {{"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                            {"tools", {{{"name", "f"}, {"input_schema", deep}}}}};
    if (json_nesting_depth(candidate.dump(), 1000) > 64) break;
    deep_body = candidate.dump();
  }
  ASSERT_GE(json_nesting_depth(deep_body, 1000), 63);
  EXPECT_TRUE(parse_messages_request(deep_body).ok()) << parse_messages_request(deep_body).error().message;
}

TEST(MessagesRequest, WhatCannotBeHonouredIsRefused) {
  const json user = {{"role", "user"}, {"content", "x"}};
  EXPECT_EQ(error_param(json::object()), "messages");
  EXPECT_EQ(error_param({{"messages", json::array()}}), "messages");
  EXPECT_EQ(error_param({{"messages", {{{"role", "system"}, {"content", "x"}}}}}), "messages.0.role");
  EXPECT_EQ(error_param({{"messages", {{{"role", "user"},
                                        {"content", {{{"type", "image"},
                                                      {"source", {{"type", "url"}, {"url", "http://x"}}}}}}}}}}),
            "messages.0.content.0.source.type");
  EXPECT_EQ(error_param({{"messages", {{{"role", "user"}, {"content", {{{"type", "document"}}}}}}}}),
            "messages.0.content.0.type");
  EXPECT_EQ(error_param({{"messages", {{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}}}}}}}}),
            "messages.0.content.0.type");  // tool_use is the assistant's
  EXPECT_EQ(error_param({{"messages", {user}}, {"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}}),
            "tools.0.type");
  EXPECT_EQ(error_param({{"messages", {user}}, {"tools", {{{"name", "f"}}}}}), "tools.0.input_schema");
  EXPECT_EQ(error_param({{"messages", {user}}, {"tool_choice", {{"type", "sometimes"}}}}), "tool_choice.type");
  EXPECT_EQ(error_param({{"messages", {user}}, {"thinking", {{"type", "maybe"}}}}), "thinking.type");
  EXPECT_EQ(error_param({{"messages", {user}}, {"max_tokens", 0}}), "max_tokens");
  EXPECT_EQ(error_param({{"messages", {user}}, {"stop_sequences", "END"}}), "stop_sequences");
  EXPECT_FALSE(parse_messages_request("{").ok());
  EXPECT_EQ(error_param({{"messages", {user}}, {"mcp_servers", json::array({1})}}), "mcp_servers");
  EXPECT_EQ(error_param({{"messages", {user, {{"role", "assistant"},
                                               {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}}}}}}}}),
            "messages");  // a prefill cannot hold a call
  // The chat parser's findings, named as the Messages API names them.
  Parsed<MessagesRequest> stops =
      parse_messages_request(json{{"messages", {user}}, {"stop_sequences", std::vector<std::string>(17, "x")}}.dump());
  ASSERT_FALSE(stops.ok());
  EXPECT_NE(stops.error().message.find("stop_sequences"), std::string::npos) << stops.error().message;
  // Anthropic's error shape, typed by status.
  EXPECT_EQ(anthropic_error_json(ApiError::invalid("bad"))["error"]["type"], "invalid_request_error");
  EXPECT_EQ(anthropic_error_json(ApiError{404, "no", "", "", ""})["error"]["type"], "not_found_error");
  EXPECT_EQ(anthropic_error_json(ApiError::server("x"))["type"], "error");
}

namespace {

// A streamed message read as Anthropic's SDK accumulates it: events in
// order, each delta naming the block started last and not yet stopped.
json read_message_stream(const std::string& body) {
  std::istringstream lines(body);
  std::string name;
  json message;
  int open = -1;
  std::vector<std::string> partial_json;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    const json e = json::parse(line.substr(6));
    EXPECT_EQ(e["type"], name);
    const std::string type = e["type"];
    if (type == "message_start") {
      EXPECT_TRUE(message.is_null());
      message = e["message"];
    } else if (type == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(e["index"], message["content"].size());
      open = e["index"];
      message["content"].push_back(e["content_block"]);
      partial_json.emplace_back();
    } else if (type == "content_block_delta") {
      EXPECT_EQ(e["index"], open);
      json& block = message["content"][open];
      const json& d = e["delta"];
      if (d["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "thinking_delta")
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "input_json_delta") partial_json[open] += d["partial_json"].get<std::string>();
      else ADD_FAILURE() << d.dump();
    } else if (type == "content_block_stop") {
      EXPECT_EQ(e["index"], open);
      if (message["content"][open]["type"] == "tool_use") message["content"][open]["input"] = json::parse(partial_json[open]);
      open = -1;
    } else if (type == "message_delta") {
      message["stop_reason"] = e["delta"]["stop_reason"];
      message["stop_sequence"] = e["delta"]["stop_sequence"];
      message["usage"] = e["usage"];
    } else if (type == "message_stop") {
      EXPECT_EQ(open, -1);
    } else {
      ADD_FAILURE() << "unexpected event " << line;
    }
  }
  return message;
}

const std::string kThought = "<think>Two and two.</think>\n\nFour.@@";
const std::string kThenCall =
    "<think>Use the tool.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
    "</tool_call>@@";
const std::string kEnds = "Fine. END and more";
constexpr int32_t kIdThought = 597, kIdThenCall = 598, kIdEnds = 599;

ServeOptions messages_server() {
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.user_defined_tokens = {kThought, kThenCall, kEnds};
  ServeOptions options = serve_with_template(
      "messages-thinking", spec,
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
      "</think>{% endif %}{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "<tool_call>{{ c.function.name }}{{ c.function.arguments }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
      "{% endfor %}{% if tools %}Call tools as <tool_call>{...}</tool_call>.{% endif %}<|im_start|>assistant\n");
  options.api_key = "secret";
  return options;
}

// A Messages body that makes the model write the scripted token `id`.
json scripted_message(int32_t id, bool stream = false) {
  json chat = scripted_reply_request("Two and two?", {{id, 100}}, stream);
  json body = {{"model", "messages-thinking"},
               {"max_tokens", 4},
               {"messages", chat["messages"]},
               {"temperature", 0},
               {"repeat_penalty", 10},
               {"stop_sequences", chat["stop"]},
               {"stream", stream}};
  body["chat_template_kwargs"] = json::object();
  return body;
}

const json kWeatherTool = json::parse(R"([{"name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])");

std::pair<int, std::string> post(const Server& s, const json& body, const std::string& key = "secret") {
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(120, 0);
  httplib::Headers headers = {{"x-api-key", key}, {"anthropic-version", "2023-06-01"}};
  auto r = c.Post("/v1/messages", headers, body.dump(), "application/json");
  return r ? std::make_pair(r->status, r->body) : std::make_pair(-1, std::string());
}

json with_bias(json body, int32_t id) {
  body["logit_bias"] = {{std::to_string(id), 100}};
  return body;
}

}  // namespace

TEST(MessagesApi, ThinkingTextToolUseAndStopSequences) {
  Server s(messages_server());
  // The model id the server serves is the GGUF's file name.
  const std::string model = json::parse(post(s, {{"max_tokens", 1}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}).second)["model"];
  auto request = [&](int32_t id, bool stream) {
    json body = with_bias(scripted_message(id, stream), id);
    body["model"] = model;
    return body;
  };

  auto [st, raw] = post(s, request(kIdThought, false));
  ASSERT_EQ(st, 200) << raw;
  const json m = json::parse(raw);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0], json::parse(R"({"type":"thinking","thinking":"Two and two.","signature":""})"));
  EXPECT_EQ(m["content"][1], json::parse(R"({"type":"text","text":"Four."})"));
  EXPECT_EQ(m["stop_reason"], "stop_sequence");  // the request's "@@"
  EXPECT_EQ(m["stop_sequence"], "@@");
  EXPECT_EQ(m["usage"]["output_tokens"], 1);
  const json streamed = read_message_stream(post(s, request(kIdThought, true)).second);
  EXPECT_EQ(streamed["content"], m["content"]);
  EXPECT_EQ(streamed["stop_reason"], "stop_sequence");

  // A call in the model's syntax is a tool_use block.
  json tools = request(kIdThenCall, false);
  tools["tools"] = kWeatherTool;
  auto [st2, raw2] = post(s, tools);
  ASSERT_EQ(st2, 200) << raw2;
  const json m2 = json::parse(raw2);
  EXPECT_EQ(m2["stop_reason"], "tool_use");
  ASSERT_EQ(m2["content"].size(), 2u) << m2.dump();
  EXPECT_EQ(m2["content"][1]["type"], "tool_use");
  EXPECT_EQ(m2["content"][1]["name"], "get_weather");
  EXPECT_EQ(m2["content"][1]["input"], json({{"city", "Rome"}}));
  tools["stream"] = true;
  const json streamed2 = read_message_stream(post(s, tools).second);
  EXPECT_EQ(streamed2["content"][1]["input"], json({{"city", "Rome"}}));
  EXPECT_EQ(streamed2["stop_reason"], "tool_use");

  // The call and its result go back as Anthropic clients send them.
  json answer = {{"model", model},
                 {"max_tokens", 2},
                 {"temperature", 0},
                 {"tools", kWeatherTool},
                 {"messages",
                  {{{"role", "user"}, {"content", "Weather in Rome?"}},
                   {{"role", "assistant"}, {"content", m2["content"]}},
                   {{"role", "user"},
                    {"content", {{{"type", "tool_result"}, {"tool_use_id", m2["content"][1]["id"]}, {"content", "Sunny"}}}}}}}};
  EXPECT_EQ(post(s, answer).first, 200);

  // A stop sequence the template adds is an end_turn; max_tokens cuts.
  json plain = request(kIdEnds, false);
  plain["stop_sequences"] = {"END"};
  const json m3 = json::parse(post(s, plain).second);
  EXPECT_EQ(m3["stop_reason"], "stop_sequence");
  EXPECT_EQ(m3["stop_sequence"], "END");
  EXPECT_EQ(m3["content"][0]["text"], "Fine. ");
  json cut = request(kIdEnds, false);
  cut.erase("stop_sequences");
  cut["max_tokens"] = 1;
  EXPECT_EQ(json::parse(post(s, cut).second)["stop_reason"], "max_tokens");

  // Errors come in Anthropic's shape; the key is read from x-api-key.
  auto [st4, raw4] = post(s, request(kIdThought, false), "wrong");
  EXPECT_EQ(st4, 401);
  EXPECT_EQ(json::parse(raw4)["error"]["type"], "authentication_error");
  auto [st5, raw5] = post(s, {{"max_tokens", 4}, {"messages", json::array()}});
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(json::parse(raw5)["type"], "error");
  EXPECT_EQ(json::parse(raw5)["error"]["type"], "invalid_request_error");
  json unknown = request(kIdThought, false);
  unknown["model"] = "no-such-model";
  auto [st6, raw6] = post(s, unknown);
  EXPECT_EQ(st6, 404);
  EXPECT_EQ(json::parse(raw6)["error"]["type"], "not_found_error");
  // A Claude model name no served model has means the default model.
  json claude = request(kIdThought, false);
  claude["model"] = "claude-sonnet-4-5";
  auto [st7, raw7] = post(s, claude);
  ASSERT_EQ(st7, 200) << raw7;
  EXPECT_EQ(json::parse(raw7)["model"], model);

  // A trailing assistant message is continued: the prompt ends with its
  // text, exactly the chat prompt with continue_final_message.
  httplib::Client client("127.0.0.1", s.port);
  httplib::Headers key = {{"x-api-key", "secret"}};
  const json turns = {{{"role", "user"}, {"content", "Two and two?"}}, {{"role", "assistant"}, {"content", "It is"}}};
  auto rendered = client.Post("/apply-template", key,
                              json{{"messages", turns}, {"continue_final_message", true}}.dump(), "application/json");
  ASSERT_EQ(rendered->status, 200) << rendered->body;
  const std::string prompt = json::parse(rendered->body)["prompt"];
  EXPECT_EQ(prompt.substr(prompt.size() - 5), "It is");
  auto tokens = client.Post("/tokenize", key, json{{"content", prompt}, {"add_special", true}}.dump(),
                            "application/json");
  auto prefilled = client.Post("/v1/messages/count_tokens", key, json{{"messages", turns}}.dump(), "application/json");
  ASSERT_EQ(prefilled->status, 200) << prefilled->body;
  EXPECT_EQ(json::parse(prefilled->body)["input_tokens"], json::parse(tokens->body)["tokens"].size());
  EXPECT_EQ(post(s, {{"max_tokens", 2}, {"messages", turns}}).first, 200);

  // Structured output through output_config.format.
  json structured = {{"max_tokens", 40}, {"temperature", 0.8}, {"seed", 3},
                     {"messages", {{{"role", "user"}, {"content", "JSON"}}}},
                     {"output_config", {{"format", {{"type", "json_schema"},
                                                    {"schema", json::parse(R"({"type":"object","properties":
                                                        {"n":{"type":"integer"}},"required":["n"],
                                                        "additionalProperties":false})")}}}}}};
  auto [sts, raws] = post(s, structured);
  ASSERT_EQ(sts, 200) << raws;
  const json answer_json = json::parse(json::parse(raws)["content"][0]["text"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(answer_json.is_object()) << raws;
  EXPECT_TRUE(answer_json["n"].is_number_integer()) << raws;

  // A tool's image, to a model that reads none: the conversation goes on.
  json with_image = {{"max_tokens", 2},
                     {"messages",
                      json::parse(R"([{"role":"user","content":"Look"},
                          {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"shot","input":{}}]},
                          {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[
                              {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}])")}};
  EXPECT_EQ(post(s, with_image).first, 200);
  with_image["messages"][2]["content"].push_back(
      json::parse(R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}})"));
  EXPECT_EQ(post(s, with_image).first, 400);  // the user's own image needs a model that reads it

  // count_tokens: the prompt a request runs.
  httplib::Client c("127.0.0.1", s.port);
  auto counted = c.Post("/v1/messages/count_tokens", {{"x-api-key", "secret"}}, request(kIdThought, false).dump(),
                        "application/json");
  ASSERT_EQ(counted->status, 200) << counted->body;
  EXPECT_EQ(json::parse(counted->body)["input_tokens"], m["usage"]["input_tokens"].get<int>() +
                                                            m["usage"]["cache_read_input_tokens"].get<int>());
}

// count_tokens counts a conversation longer than the context too (agents
// count to know when to compact); the same request to /v1/messages is a 400.
TEST(MessagesApi, CountTokensBeyondTheContext) {
  ServeOptions options = messages_server();
  options.ctx_size = 32;
  Server s(options);
  const json body = {{"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", std::string(400, 'a')}}}}};
  httplib::Client c("127.0.0.1", s.port);
  auto counted = c.Post("/v1/messages/count_tokens", {{"x-api-key", "secret"}}, body.dump(), "application/json");
  ASSERT_EQ(counted->status, 200) << counted->body;
  EXPECT_GT(json::parse(counted->body)["input_tokens"].get<int>(), 32);
  auto [st, raw] = post(s, body);
  EXPECT_EQ(st, 400) << raw;
}

// The cache differential: a conversation sent again with one more turn
// reads its earlier turns from the prefix cache (cache_read_input_tokens)
// and replies exactly as a cold server replies to it.
TEST(MessagesApi, CachedTurnsReplyAsColdRunsDo) {
  ServeOptions options = serve_with_template(
      "messages-plain", synthetic_preset("tiny-qwen3"),
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n");
  Server warm(options);
  std::mt19937_64 rng(42);
  const std::vector<std::string> words = {"red", "fox", "jumps", "over", "lazy", "dog", "sky"};
  auto sentence = [&] {
    std::string s;
    for (size_t i = 0, n = 3 + rng() % 5; i < n; ++i) s += (i ? " " : "") + words[rng() % words.size()];
    return s;
  };
  for (int round = 0; round < 3; ++round) {
    json body = {{"max_tokens", 6}, {"temperature", round == 1 ? 0.9 : 0.0}, {"seed", round}, {"system", "Terse."},
                 {"messages", {{{"role", "user"}, {"content", sentence()}}}}};
    auto [st1, r1] = warm.post("/v1/messages", body);
    ASSERT_EQ(st1, 200) << r1.dump();
    body["messages"].push_back({{"role", "assistant"}, {"content", r1["content"]}});
    body["messages"].push_back({{"role", "user"}, {"content", sentence()}});
    auto [st2, r2] = warm.post("/v1/messages", body);
    ASSERT_EQ(st2, 200) << r2.dump();
    EXPECT_GT(r2["usage"]["cache_read_input_tokens"].get<int>(), 0) << r2.dump();
    Server cold(options);
    auto [st3, r3] = cold.post("/v1/messages", body);
    ASSERT_EQ(st3, 200);
    EXPECT_EQ(r3["usage"]["cache_read_input_tokens"], 0);
    EXPECT_EQ(r3["usage"]["input_tokens"], r2["usage"]["input_tokens"].get<int>() +
                                               r2["usage"]["cache_read_input_tokens"].get<int>());
    EXPECT_EQ(r3["content"], r2["content"]) << "round " << round;
    EXPECT_EQ(r3["stop_reason"], r2["stop_reason"]);
  }
}
