// Server features that combine the caches: image inputs (encoder cache +
// image-keyed prefix reuse), recurrent-state snapshots and speculative
// decoding, through the HTTP API.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"
#include "model_fixtures.h"
#include "server/http_server.h"
#include "server/model_registry.h"
#include "server/serve_options.h"
#include "test_server.h"
#include "test_support.h"

using namespace reprise;
using nlohmann::json;
using namespace std::chrono_literals;
using test::kWeatherTools;
using test::scripted_reply_request;
using test::serve_with_template;
using test::Server;

namespace {

std::string base64(const std::string& bytes) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += tbl[(v >> k) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += tbl[(v >> 18) & 63];
    out += tbl[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? tbl[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json image_chat(const std::string& data_url, const std::string& question) {
  return {{"messages",
           {{{"role", "user"},
             {"content",
              {{{"type", "text"}, {"text", "Here is an image:"}},
               {{"type", "image_url"}, {"image_url", {{"url", data_url}}}},
               {{"type", "text"}, {"text", question}}}}}}},
          {"max_tokens", 6},
          {"temperature", 0}};
}

TEST(ServerImages, EncoderCacheAndImageKeyedPrefixReuse) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ServeOptions o;
  o.model_path = fixtures + "/models/gemma3-spm-f16.gguf";
  o.mmproj = fixtures + "/models/mmproj-tinygemma3.gguf";
  Server s(o);
  const std::string checker = "data:image/png;base64," + base64(read_file(fixtures + "/images/checker-32.png"));
  const std::string gradient = "data:image/png;base64," + base64(read_file(fixtures + "/images/gradient-32.png"));

  auto [st1, first] = s.post("/v1/chat/completions", image_chat(checker, "Describe it."));
  ASSERT_EQ(st1, 200) << first.dump();
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 256);  // 256 image soft tokens plus text

  // Exact repeat: the encoder does not run again and everything but the last
  // prompt token is reused; the answer is the same.
  auto [st2, again] = s.post("/v1/chat/completions", image_chat(checker, "Describe it."));
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
  EXPECT_EQ(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.metric("reprise_encoder_cache_misses_total"), 1);
  EXPECT_EQ(s.metric("reprise_encoder_cache_hits_total"), 1);
  // One memory view: KV blocks and encoder outputs both counted.
  EXPECT_GT(s.metric("reprise_memory_bytes{model=\"gemma3-spm-f16\",kind=\"encoder\"}"), 0);
  EXPECT_GT(s.metric("reprise_memory_bytes{model=\"gemma3-spm-f16\",kind=\"kv\"}"), 0);

  // Another tenant (cache_salt) sending the same image shares neither the
  // prefix nor the encoder's output: a hit would tell it, by the response
  // time, that someone sent that image. Its answer is the same.
  json salted = image_chat(checker, "Describe it.");
  salted["cache_salt"] = "tenant-b";
  auto [st5, tenant] = s.post("/v1/chat/completions", salted);
  ASSERT_EQ(st5, 200) << tenant.dump();
  EXPECT_EQ(tenant["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(tenant["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.metric("reprise_encoder_cache_misses_total"), 2);
  EXPECT_EQ(s.metric("reprise_encoder_cache_hits_total"), 1);
  auto [st6, tenant_again] = s.post("/v1/chat/completions", salted);  // its own repeat hits both caches
  ASSERT_EQ(st6, 200);
  EXPECT_EQ(tenant_again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
  EXPECT_EQ(s.metric("reprise_encoder_cache_hits_total"), 2);

  // A different image at the same place: only the text before it is reused.
  auto [st3, other] = s.post("/v1/chat/completions", image_chat(gradient, "Describe it."));
  ASSERT_EQ(st3, 200);
  const int64_t reused = other["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(reused, 0);
  EXPECT_LT(reused, 32);  // the text before the image, never image tokens
  EXPECT_EQ(s.metric("reprise_encoder_cache_misses_total"), 3);

  // A corrupt image is a clear 400 naming the content part.
  auto [st4, bad] = s.post("/v1/chat/completions", image_chat("data:image/png;base64,iVBORw0KGgoAAAA", "?"));
  EXPECT_EQ(st4, 400);
  EXPECT_EQ(bad["error"]["code"], "invalid_image");
  EXPECT_EQ(bad["error"]["param"], "messages[0].content[1].image_url");
}

TEST(ServerSnapshots, HybridModelReusesTurnOneThroughSnapshots) {
  SyntheticModelSpec spec = synthetic_preset("tiny-jamba");
  spec.n_vocab = 400;
  ServeOptions o;
  o.model_path = test::synthetic_model("server-jamba", spec).path;
  Server s(o);
  json turn1 = {{"prompt", "once upon a time there was a small model that kept its state"},
                {"max_tokens", 4},
                {"temperature", 0}};
  auto [st1, a] = s.post("/v1/completions", turn1);
  ASSERT_EQ(st1, 200) << a.dump();
  json turn2 = turn1;
  turn2["prompt"] = turn1["prompt"].get<std::string>() + a["choices"][0]["text"].get<std::string>() + " and more";
  auto [st2, b] = s.post("/v1/completions", turn2);
  ASSERT_EQ(st2, 200);
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  EXPECT_GE(s.metric("reprise_snapshot_hits_total"), 1);
  EXPECT_GT(s.metric("reprise_snapshot_tokens_saved_total"), 0);
  EXPECT_GT(s.metric("reprise_memory_bytes{model=\"server-jamba\",kind=\"snapshots\"}"), 0);
}

TEST(ServerSpeculative, DraftGivesTheSameGreedyTextAndCountsTokens) {
  SyntheticModelSpec target = synthetic_preset("tiny-qwen3");
  target.n_vocab = 400;
  SyntheticModelSpec draft = target;
  draft.seed = 99;
  draft.n_layer = 1;
  const std::string target_path = test::synthetic_model("server-spec-target", target).path;
  ServeOptions plain_options;
  plain_options.model_path = target_path;
  ServeOptions draft_options = plain_options;
  draft_options.draft_model = test::synthetic_model("server-spec-draft", draft).path;
  draft_options.draft_max = 4;
  json req = {{"prompt", "the quick brown fox"}, {"max_tokens", 24}, {"temperature", 0}};
  std::string plain_text, draft_text;
  {
    Server s(plain_options);
    auto [st, r] = s.post("/v1/completions", req);
    ASSERT_EQ(st, 200);
    plain_text = r["choices"][0]["text"];
  }
  {
    Server s(draft_options);
    auto [st, r] = s.post("/v1/completions", req);
    ASSERT_EQ(st, 200);
    draft_text = r["choices"][0]["text"];
    const double drafted = s.metric("reprise_draft_tokens_total");
    EXPECT_GT(drafted, 0);
    // The draft's passes, one sequence each here (one request at a time).
    const double draft_passes = s.metric("reprise_draft_forward_passes_total");
    EXPECT_GT(draft_passes, 0);
    EXPECT_EQ(s.metric("reprise_draft_forward_pass_sequences_total"), draft_passes);
    EXPECT_GE(s.metric("reprise_draft_accepted_tokens_total"), 0);
    // Per-request override: draft_max 0 turns drafting off for that request.
    json off = req;
    off["draft_max"] = 0;
    auto [st2, r2] = s.post("/v1/completions", off);
    ASSERT_EQ(st2, 200);
    EXPECT_EQ(r2["choices"][0]["text"], draft_text);
    EXPECT_EQ(s.metric("reprise_draft_tokens_total"), drafted);
    json bad = req;
    bad["draft_max"] = 1000;
    EXPECT_EQ(s.post("/v1/completions", bad).first, 400);
  }
  EXPECT_EQ(plain_text, draft_text);
}

// Concurrent speculative requests over HTTP (sharing draft and verify
// passes), greedy and seeded sampling, get the text each gets when sent by
// itself.
TEST(ServerSpeculative, ConcurrentRequestsGetWhatEachGetsAlone) {
  SyntheticModelSpec target = synthetic_preset("tiny-qwen3");
  target.n_vocab = 400;
  SyntheticModelSpec draft = target;
  draft.n_layer = 1;  // same seed: shares the target's embeddings and output, so it is often right
  ServeOptions options;
  options.model_path = test::synthetic_model("server-spec-target", target).path;
  options.draft_model = test::synthetic_model("server-spec-draft-same-seed", draft).path;
  options.draft_max = 4;
  options.parallel = 4;
  std::vector<json> reqs;
  for (int i = 0; i < 6; ++i) {
    json r = {{"prompt", "story number " + std::to_string(i) + " begins"}, {"max_tokens", 20}};
    if (i % 2) r["temperature"] = 0;
    else r.update({{"temperature", 0.8}, {"seed", 100 + i}});
    reqs.push_back(r);
  }
  std::vector<std::string> alone(reqs.size()), together(reqs.size());
  Server s(options);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto [st, r] = s.post("/v1/completions", reqs[i]);
    ASSERT_EQ(st, 200);
    alone[i] = r["choices"][0]["text"];
  }
  std::vector<std::thread> threads;
  std::vector<int> status(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] {
      auto [st, r] = s.post("/v1/completions", reqs[i]);
      status[i] = st;
      if (st == 200) together[i] = r["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(status[i], 200) << i;
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
  }
  EXPECT_GT(s.metric("reprise_draft_accepted_tokens_total"), 0);
  EXPECT_GT(s.metric("reprise_draft_forward_passes_total"), 0);
}

}  // namespace

// Structured output (response_format): every finished reply is a document
// the schema allows, an unfinished one is a prefix of one, the prefix cache
// gives the same replies as a cold run, and what reprise does not enforce
// is refused.
namespace {

const json kPersonSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                          "required": ["kind"]}]}
  },
  "required": ["name", "age"]})");

// A server on a small random model (its vocabulary holds every byte).
ServeOptions structured_output_options() {
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  ServeOptions options;
  options.model_path = test::synthetic_model("structured-output", spec).path;
  return options;
}

json structured_request(uint64_t seed) {
  return {{"messages", {{{"role", "user"}, {"content", "Describe a person as JSON."}}}},
          {"max_tokens", 160},
          {"temperature", 1.0},
          {"seed", seed},
          {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", kPersonSchema}}}}}};
}

}  // namespace

TEST(ServerStructuredOutput, RepliesAreDocumentsTheSchemaAllows) {
  Server s(structured_output_options());
  const auto schema = JsonSchema::compile(kPersonSchema);
  int finished = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    auto [st, r] = s.post("/v1/chat/completions", structured_request(seed));
    ASSERT_EQ(st, 200) << r.dump();
    const std::string text = r["choices"][0]["message"]["content"];
    const std::string finish = r["choices"][0]["finish_reason"];
    JsonMatcher matcher(schema);
    ASSERT_TRUE(matcher.advance(text)) << "seed " << seed << ": " << text;
    if (finish == "stop") {
      ++finished;
      ASSERT_TRUE(matcher.can_end()) << text;
      const json doc = json::parse(text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << text;
      EXPECT_TRUE(doc.contains("name") && doc["name"].is_string() && doc.contains("age")) << text;
      EXPECT_TRUE(schema->validates(doc)) << text;
    } else {
      EXPECT_EQ(finish, "length");
    }
  }
  // Every string, array and key is bounded, so random weights finish too.
  EXPECT_GE(finished, 20);

  // json_object: an object, whatever the model.
  json object_request = structured_request(5);
  object_request["response_format"] = {{"type", "json_object"}};
  object_request["max_tokens"] = 48;
  auto [st, r] = s.post("/v1/chat/completions", object_request);
  ASSERT_EQ(st, 200);
  const std::string text = r["choices"][0]["message"]["content"];
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text[0], '{');
  JsonMatcher any(JsonSchema::any_object());
  EXPECT_TRUE(any.advance(text)) << text;
}

TEST(ServerStructuredOutput, CachedRepliesEqualColdOnes) {
  const ServeOptions options = structured_output_options();
  std::vector<std::string> cold;
  {
    Server s(options);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      auto [st, r] = s.post("/v1/chat/completions", structured_request(seed * 7));
      ASSERT_EQ(st, 200);
      cold.push_back(r["choices"][0]["message"]["content"]);
    }
  }
  Server s(options);
  for (int round = 0; round < 2; ++round)
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      auto [st, r] = s.post("/v1/chat/completions", structured_request(seed * 7));
      ASSERT_EQ(st, 200);
      EXPECT_EQ(r["choices"][0]["message"]["content"], cold[seed - 1]) << "seed " << seed * 7 << " round " << round;
      if (round == 1 || seed > 1) {
        EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
      }
    }
}

// Concurrent constrained requests share decode passes (and the model's
// vocabulary trie and remembered string states): each gets what it gets alone.
TEST(ServerStructuredOutput, ConcurrentRequestsGetWhatEachGetsAlone) {
  ServeOptions options = structured_output_options();
  options.parallel = 4;
  Server s(options);
  std::vector<json> reqs;
  for (uint64_t i = 0; i < 6; ++i) {
    json r = structured_request(40 + i);
    if (i % 3 == 2) r["response_format"] = {{"type", "json_object"}};
    if (i % 2) r["temperature"] = 0;
    r["max_tokens"] = 60;
    reqs.push_back(r);
  }
  std::vector<std::string> alone(reqs.size()), together(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto [st, r] = s.post("/v1/chat/completions", reqs[i]);
    ASSERT_EQ(st, 200);
    alone[i] = r["choices"][0]["message"]["content"];
  }
  std::vector<std::thread> threads;
  std::vector<int> status(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] {
      auto [st, r] = s.post("/v1/chat/completions", reqs[i]);
      status[i] = st;
      if (st == 200) together[i] = r["choices"][0]["message"]["content"];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(status[i], 200) << i;
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
  }
}

TEST(ServerStructuredOutput, WhatIsNotEnforcedIsRefused) {
  Server s(structured_output_options());
  auto with_format = [](json format) {
    json r = structured_request(1);
    r["response_format"] = std::move(format);
    return r;
  };
  const json pattern = {{"type", "json_schema"},
                        {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^(?=a)a+$"}}}}}};
  auto [st, r] = s.post("/v1/chat/completions", with_format(pattern));
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["param"], "response_format.json_schema.schema");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("pattern"), std::string::npos) << r.dump();
  EXPECT_EQ(s.post("/v1/chat/completions", with_format({{"type", "xml"}})).first, 400);
  EXPECT_EQ(s.post("/v1/chat/completions", with_format({{"type", "json_schema"}})).first, 400);
  EXPECT_EQ(s.post("/v1/chat/completions", with_format({{"type", "json_schema"}, {"json_schema", {{"schema", 3}}}})).first,
            400);
  EXPECT_EQ(s.post("/v1/chat/completions", with_format({{"type", "text"}})).first, 200);
  // Text completions take it too.
  json completion = {{"prompt", "{"}, {"max_tokens", 16}, {"response_format", {{"type", "json_object"}}}};
  auto [st2, r2] = s.post("/v1/completions", completion);
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(r2["choices"][0]["text"].get<std::string>().substr(0, 1), "{");
}

// tool_choice "required" or a named function: the reply is one call of an
// allowed tool, returned as message.tool_calls with arguments that satisfy
// the tool's parameters, streamed as one tool_calls delta.
TEST(ServerStructuredOutput, ForcedToolCallsComeBackAsToolCalls) {
  Server s(structured_output_options());
  const json weather_params = json::parse(R"({"type":"object","properties":{
      "city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]},
      "days":{"$ref":"#/$defs/count"}},"required":["city","unit"],"$defs":{"count":{"type":"integer"}}})");
  const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", weather_params}}}},
                      {{"type", "function"},
                       {"function", {{"name", "stop"}, {"parameters", json::object()}}}}};  // {}: an object still
  const auto weather = JsonSchema::compile(weather_params);
  std::set<std::string> names;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    json req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                {"tools", tools},
                {"tool_choice", seed % 3 == 0 ? json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}
                                              : json("required")},
                {"max_tokens", 120},
                {"temperature", 1.0},
                {"seed", seed}};
    auto [st, r] = s.post("/v1/chat/completions", req);
    ASSERT_EQ(st, 200) << r.dump();
    const json& choice = r["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    EXPECT_TRUE(choice["message"]["content"].is_null());
    const json& call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
    const std::string name = call["function"]["name"];
    names.insert(name);
    const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
      EXPECT_TRUE(weather->validates(arguments)) << arguments.dump();
    } else {
      EXPECT_NE(seed % 3, 0u) << "a named choice called " << name;
      EXPECT_EQ(name, "stop");
      EXPECT_EQ(arguments, json::object());
    }
  }
  EXPECT_TRUE(names.count("get_weather"));

  // Streamed: one delta with the whole call, then finish_reason tool_calls.
  httplib::Client c("127.0.0.1", s.port);
  json req = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"tools", tools},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
              {"max_tokens", 120}, {"seed", 4}, {"stream", true}};
  auto streamed = c.Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(streamed);
  int calls = 0;
  std::string finish;
  std::istringstream lines(streamed->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    for (const auto& ch : chunk["choices"]) {
      if (ch["delta"].contains("tool_calls")) {
        ++calls;
        EXPECT_EQ(ch["delta"]["tool_calls"][0]["index"], 0);
        EXPECT_EQ(ch["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
        EXPECT_TRUE(weather->validates(json::parse(ch["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>())));
      }
      EXPECT_FALSE(ch["delta"].contains("content") && !ch["delta"]["content"].get<std::string>().empty());
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(finish, "tool_calls");

  // What cannot be honoured is refused.
  json bad = req;
  bad["stream"] = false;
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  EXPECT_EQ(s.post("/v1/chat/completions", bad).first, 400);
  bad["tool_choice"] = "required";
  bad.erase("tools");
  EXPECT_EQ(s.post("/v1/chat/completions", bad).first, 400);
  bad["tools"] = tools;
  bad["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(s.post("/v1/chat/completions", bad).first, 400);
  bad.erase("response_format");
  json string_params = bad;
  string_params["tools"][0]["function"]["parameters"] = {{"type", "string"}};
  EXPECT_EQ(s.post("/v1/chat/completions", string_params).first, 400);
  bad["tools"][0]["function"]["parameters"]["properties"]["city"]["multipleOf"] = 2;
  auto [st, r] = s.post("/v1/chat/completions", bad);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["param"], "tools[0].function.parameters") << r.dump();
}

// tool_choice auto: calls the model writes in its template's syntax come
// back as message.tool_calls, streamed or not; text around them stays
// content; tool_choice "none", a request without tools, and markup that does
// not parse leave the reply as text. The synthetic model is made to write
// exact text with logit_bias: token A, then (A repetition-penalised) B, and
// a stop string at B's end.
TEST(ServerToolCalls, CallsInTheModelsSyntaxBecomeToolCalls) {
  const std::string hermes = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                             "</tool_call>@@";
  const std::string broken = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>@@";
  const std::string mistral_args = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]@@";
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.control_tokens = {"[TOOL_CALLS]"};
  spec.user_defined_tokens = {hermes, broken, mistral_args};
  const std::string path = test::synthetic_model("tool-calls", spec).path;
  const int32_t id_control = 596, id_hermes = 597, id_broken = 598, id_mistral = 599;
  const std::string dir = ::testing::TempDir();
  auto write_template = [&](const std::string& name, const std::string& marker) {
    const std::string file = dir + "/" + name + ".jinja";
    std::ofstream(file) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if tools %}Call tools as " << marker << ".{% endif %}<|im_start|>assistant\n";
    return file;
  };
  auto request = [&](std::vector<std::pair<int32_t, double>> bias, bool stream) {
    json r = scripted_reply_request("Weather in Paris?", bias, stream);
    r["tools"] = kWeatherTools;
    return r;
  };
  auto streamed = [](const Server& s, const json& req) {
    Server::Streamed r = s.stream_chat(req);
    return std::make_tuple(r.content, r.calls, r.finish);
  };

  {
    ServeOptions options;
    options.model_path = path;
    options.chat_template_file = write_template("hermes", "<tool_call>{...}</tool_call>");
    Server s(options);
    auto [st, r] = s.post("/v1/chat/completions", request({{id_hermes, 100}}, false));
    ASSERT_EQ(st, 200) << r.dump();
    const json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    EXPECT_EQ(choice["message"]["content"], "Checking.");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              json({{"city", "Paris"}}));

    // Logprobs come with the calls.
    json with_logprobs = request({{id_hermes, 100}}, false);
    with_logprobs["logprobs"] = true;
    auto [stl, rl] = s.post("/v1/chat/completions", with_logprobs);
    EXPECT_EQ(rl["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(rl["choices"][0]["logprobs"]["content"].size(), 1u) << rl.dump();

    auto [content, calls, finish] = streamed(s, request({{id_hermes, 100}}, true));
    EXPECT_EQ(content, "Checking.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(finish, "tool_calls");

    // Markup that does not parse, tool_choice none, no tools: text.
    auto [st2, r2] = s.post("/v1/chat/completions", request({{id_broken, 100}}, false));
    EXPECT_EQ(r2["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(r2["choices"][0]["message"]["content"], broken.substr(0, broken.size() - 2));
    auto [content2, calls2, finish2] = streamed(s, request({{id_broken, 100}}, true));
    EXPECT_EQ(content2, broken.substr(0, broken.size() - 2));
    EXPECT_TRUE(calls2.empty());
    json none = request({{id_hermes, 100}}, false);
    none["tool_choice"] = "none";
    EXPECT_EQ(s.post("/v1/chat/completions", none).second["choices"][0]["message"]["content"],
              hermes.substr(0, hermes.size() - 2));
    json no_tools = request({{id_hermes, 100}}, false);
    no_tools.erase("tools");
    EXPECT_EQ(s.post("/v1/chat/completions", no_tools).second["choices"][0]["finish_reason"], "stop");
  }
  {
    // Mistral: [TOOL_CALLS] is a control token, shown so the call is read.
    ServeOptions options;
    options.model_path = path;
    // (The marker in a comment: rendered into the prompt it would be the
    // control token, which the repetition penalty would then hold back.)
    options.chat_template_file = write_template("mistral", "a list{# [TOOL_CALLS][...] #}");
    Server s(options);
    auto [st, r] = s.post("/v1/chat/completions", request({{id_control, 100}, {id_mistral, 90}}, false));
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
    EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null());
    EXPECT_EQ(json::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              json({{"city", "Oslo"}}));
    // Mistral's templates accept only 9-alphanumeric call ids.
    EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["id"].get<std::string>().size(), 9u);
    json forced = request({}, false);
    forced["tool_choice"] = "required";
    forced["max_tokens"] = 200;
    forced.erase("stop");
    forced.erase("repeat_penalty");
    auto [stf, rf] = s.post("/v1/chat/completions", forced);
    ASSERT_EQ(rf["choices"][0]["finish_reason"], "tool_calls") << rf.dump();
    EXPECT_EQ(rf["choices"][0]["message"]["tool_calls"][0]["id"].get<std::string>().size(), 9u);
  }
}

// DeepSeek's call list (its list marker a control token, shown so that the
// call is read) and Llama 3.2/4's Python call list come back as tool calls,
// streamed or not; a Python list of an undeclared function stays text.
TEST(ServerToolCalls, DeepSeekAndPythonicCallsBecomeToolCalls) {
  const std::string deepseek =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>@@";
  const std::string pythonic = "[get_weather(city='Quito', units=None)]@@";
  const std::string undeclared = "[launch(target='moon')]@@";
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.control_tokens = {"<｜tool▁calls▁begin｜>"};
  spec.user_defined_tokens = {deepseek, pythonic, undeclared};
  const std::string path = test::synthetic_model("tool-calls-2", spec).path;
  const int32_t id_begin = 596, id_deepseek = 597, id_pythonic = 598, id_undeclared = 599;
  auto write_template = [&](const std::string& name, const std::string& comment) {
    const std::string file = ::testing::TempDir() + "/" + name + ".jinja";
    std::ofstream(file) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{# " << comment << " #}<|im_start|>assistant\n";
    return file;
  };
  auto request = [&](std::vector<std::pair<int32_t, double>> bias, bool stream) {
    json r = scripted_reply_request("Weather?", bias, stream);
    r["tools"] = kWeatherTools;
    return r;
  };
  struct Case {
    const char* name;
    std::string comment;
    std::vector<std::pair<int32_t, double>> bias;
    json arguments;
  };
  for (const Case& c : {Case{"deepseek", "<｜tool▁calls▁begin｜> marks calls", {{id_begin, 100}, {id_deepseek, 90}},
                             json({{"city", "Lima"}})},
                        Case{"pythonic", "format of [func_name1(params_name1=params_value1)]", {{id_pythonic, 100}},
                             json({{"city", "Quito"}, {"units", nullptr}})}}) {
    SCOPED_TRACE(c.name);
    ServeOptions options;
    options.model_path = path;
    options.chat_template_file = write_template(c.name, c.comment);
    Server s(options);
    auto [st, r] = s.post("/v1/chat/completions", request(c.bias, false));
    ASSERT_EQ(st, 200) << r.dump();
    const json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    EXPECT_TRUE(choice["message"]["content"].is_null()) << r.dump();
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()), c.arguments);
    const Server::Streamed streamed = s.stream_chat(request(c.bias, true));
    EXPECT_EQ(streamed.content, "");
    ASSERT_EQ(streamed.calls.size(), 1u);
    EXPECT_EQ(streamed.calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(streamed.finish, "tool_calls");
    if (std::string(c.name) == "pythonic") {
      auto [stu, ru] = s.post("/v1/chat/completions", request({{id_undeclared, 100}}, false));
      EXPECT_EQ(ru["choices"][0]["finish_reason"], "stop") << ru.dump();
      EXPECT_EQ(ru["choices"][0]["message"]["content"], undeclared.substr(0, undeclared.size() - 2));
    }
  }
}

// A thinking model's reply: <think> reasoning comes back as
// message.reasoning_content (streamed as delta.reasoning_content) and the
// rest as content; also when the template's generation prompt opened the
// reasoning itself, and with a tool call after it. reasoning_format "none"
// and text completions keep the reply raw.
TEST(ServerReasoning, ThinkingIsReasoningContent) {
  const std::string thought = "<think>Two and two.</think>\n\nFour.@@";
  const std::string opened = "Hmm.</think>Four.@@";
  const std::string then_call =
      "<think>Use the tool.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
      "</tool_call>@@";
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.user_defined_tokens = {thought, opened, then_call};
  const int32_t id_thought = 597, id_opened = 598, id_then_call = 599;
  Server s(serve_with_template(
      "thinking", spec,
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if tools %}Call tools as <tool_call>{...}</tool_call>.{% endif %}"
      "<|im_start|>assistant\n{% if opens %}<think>\n{% endif %}"));
  auto request = [](int32_t id, bool stream) { return scripted_reply_request("Two and two?", {{id, 100}}, stream); };
  auto streamed = [&](const json& body) {
    Server::Streamed r = s.stream_chat(body);
    return std::make_pair(r.reasoning, r.content);
  };

  auto [st, r] = s.post("/v1/chat/completions", request(id_thought, false));
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Two and two.") << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Four.");
  EXPECT_EQ(streamed(request(id_thought, true)), std::make_pair(std::string("Two and two."), std::string("Four.")));

  // The generation prompt opened <think> itself: the reply starts inside it.
  json opens = request(id_opened, false);
  opens["chat_template_kwargs"] = {{"opens", true}};
  auto [st2, r2] = s.post("/v1/chat/completions", opens);
  EXPECT_EQ(r2["choices"][0]["message"]["reasoning_content"], "Hmm.") << r2.dump();
  EXPECT_EQ(r2["choices"][0]["message"]["content"], "Four.");
  opens["stream"] = true;
  EXPECT_EQ(streamed(opens), std::make_pair(std::string("Hmm."), std::string("Four.")));

  // Reasoning, then a call: both read out.
  json with_tools = request(id_then_call, false);
  with_tools["tools"] = kWeatherTools;
  auto [st3, r3] = s.post("/v1/chat/completions", with_tools);
  EXPECT_EQ(r3["choices"][0]["finish_reason"], "tool_calls") << r3.dump();
  EXPECT_EQ(r3["choices"][0]["message"]["reasoning_content"], "Use the tool.");
  EXPECT_TRUE(r3["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(json::parse(r3["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Rome"}}));
  with_tools["stream"] = true;
  EXPECT_EQ(streamed(with_tools).first, "Use the tool.");

  // Raw: reasoning_format "none", and text completions.
  json raw = request(id_thought, false);
  raw["reasoning_format"] = "none";
  auto [st4, r4] = s.post("/v1/chat/completions", raw);
  EXPECT_EQ(r4["choices"][0]["message"]["content"], thought.substr(0, thought.size() - 2));
  EXPECT_FALSE(r4["choices"][0]["message"].contains("reasoning_content"));
  raw["reasoning_format"] = "xml";
  EXPECT_EQ(s.post("/v1/chat/completions", raw).first, 400);
  json completion = {{"prompt", "Q:"}, {"max_tokens", 4}, {"temperature", 0},
                     {"logit_bias", {{std::to_string(id_thought), 100}}}, {"stop", json::array({"@@"})}};
  auto [st5, r5] = s.post("/v1/completions", completion);
  EXPECT_EQ(r5["choices"][0]["text"], thought.substr(0, thought.size() - 2));
}

// gpt-oss's harmony replies: the analysis channel comes back as
// reasoning_content, final as content, messages to functions as tool
// calls, streamed or not; the markers are control tokens, shown so that
// the channels can be read.
TEST(ServerHarmony, ChannelsBecomeReasoningContentAndToolCalls) {
  const std::string answer = "analysis<|message|>Easy sum.<|end|><|start|>assistant<|channel|>final<|message|>Four.@@";
  const std::string call = "analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary "
                           "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}@@";
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.control_tokens = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>",
                         "<|constrain|>"};
  spec.user_defined_tokens = {answer, call};
  const int32_t id_channel = 600 - 9 + 1, id_answer = 598, id_call = 599;
  // (The channel marker in a comment: rendered, it would be the control
  // token the test biases, held back then by the repetition penalty.)
  Server s(serve_with_template("harmony", spec,
                               "{# <|channel|> #}{% for m in messages %}<|start|>{{ m.role }}<|message|>"
                               "{{ m.content }}<|end|>{% endfor %}<|start|>assistant"));
  // The reply: the <|channel|> control token first, then the rest.
  auto request = [&](int32_t rest, bool stream) {
    json r = scripted_reply_request("Two and two?", {{id_channel, 100}, {rest, 90}}, stream);
    r["tools"] = kWeatherTools;
    return r;
  };
  auto streamed = [&](const json& body) {
    Server::Streamed r = s.stream_chat(body);
    return std::make_tuple(r.reasoning, r.content, r.calls, r.finish);
  };

  auto [st, r] = s.post("/v1/chat/completions", request(id_answer, false));
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Easy sum.") << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Four.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  auto [reasoning, content, calls, finish] = streamed(request(id_answer, true));
  EXPECT_EQ(reasoning, "Easy sum.");
  EXPECT_EQ(content, "Four.");
  EXPECT_TRUE(calls.empty());

  auto [st2, r2] = s.post("/v1/chat/completions", request(id_call, false));
  ASSERT_EQ(st2, 200) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["finish_reason"], "tool_calls") << r2.dump();
  EXPECT_EQ(r2["choices"][0]["message"]["reasoning_content"], "Need the tool.");
  EXPECT_TRUE(r2["choices"][0]["message"]["content"].is_null());
  ASSERT_EQ(r2["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(r2["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(r2["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}}));
  auto [reasoning2, content2, calls2, finish2] = streamed(request(id_call, true));
  EXPECT_EQ(reasoning2, "Need the tool.");
  EXPECT_EQ(content2, "");
  ASSERT_EQ(calls2.size(), 1u);
  EXPECT_EQ(calls2[0]["function"]["name"], "get_weather");
  EXPECT_EQ(finish2, "tool_calls");

  // reasoning_format "none": the raw reply.
  json raw = request(id_answer, false);
  raw["reasoning_format"] = "none";
  auto [st3, r3] = s.post("/v1/chat/completions", raw);
  EXPECT_NE(r3["choices"][0]["message"]["content"].get<std::string>().find(answer.substr(0, answer.size() - 2)),
            std::string::npos)
      << r3.dump();
  EXPECT_FALSE(r3["choices"][0]["message"].contains("reasoning_content"));
}

// parallel_tool_calls false: a reply holding several calls returns its
// first only, streamed or not; by default all of them.
TEST(ServerToolCalls, ParallelToolCallsFalseKeepsTheFirst) {
  const std::string two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>@@";
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  spec.user_defined_tokens = {two};
  Server s(serve_with_template(
      "tool-calls-parallel", spec,
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if tools %}Call tools as <tool_call>{...}</tool_call>.{% endif %}<|im_start|>assistant\n"));
  json request = scripted_reply_request("Weather in Paris and Rome?", {{599, 100}});
  request["tools"] = kWeatherTools;
  auto cities = [](const json& calls) {
    std::vector<std::string> out;
    for (const json& c : calls) out.push_back(json::parse(c["function"]["arguments"].get<std::string>())["city"]);
    return out;
  };
  auto [st, r] = s.post("/v1/chat/completions", request);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(cities(r["choices"][0]["message"]["tool_calls"]), (std::vector<std::string>{"Paris", "Rome"}));
  request["parallel_tool_calls"] = false;
  auto [st2, r2] = s.post("/v1/chat/completions", request);
  EXPECT_EQ(cities(r2["choices"][0]["message"]["tool_calls"]), (std::vector<std::string>{"Paris"})) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["finish_reason"], "tool_calls");
  request["stream"] = true;
  EXPECT_EQ(cities(s.stream_chat(request).calls), (std::vector<std::string>{"Paris"}));
}
