// reprise serve: request parsing and validation (with a mutation fuzz),
// response building, stop strings, metrics text, and loopback HTTP tests
// against in-process servers on synthetic models: streaming, concurrency,
// stalled and disconnecting clients, errors, API keys, several models with
// separate caches, LRU unloading and prefix-cache reuse across chat turns.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model_fixtures.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/model_chat_template.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/prompt_builder.h"
#include "server/stop_matcher.h"
#include "json_mutation.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace reprise;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// ---------------------------------------------------------------------------
// Models

SyntheticModelSpec model_a_spec() {
  SyntheticModelSpec s = synthetic_preset("tiny");
  s.n_ctx = 4096;  // long enough that a generation outlives a disconnect check
  return s;
}

SyntheticModelSpec model_b_spec() {
  SyntheticModelSpec s = synthetic_preset("tiny");
  s.seed = 2;  // different weights, so a different fingerprint
  return s;
}

const std::string& model_a_path() { return test::synthetic_model("server-a", model_a_spec()).path; }
const std::string& model_b_path() { return test::synthetic_model("server-b", model_b_spec()).path; }

const Tokenizer& tiny_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*test::synthetic_model("server-a", model_a_spec()).file);
  return *tok;
}

// ---------------------------------------------------------------------------
// In-process servers

struct TestServer {
  explicit TestServer(ServeOptions options = {}, std::vector<ModelSource> sources = {}) {
    if (sources.empty()) sources = {{"tiny-a", model_a_path()}, {"tiny-b", model_b_path()}};
    options.port = 0;
    options.log_requests = false;
    if (options.model_path.empty() && options.model_specs.empty()) options.model_path = sources.front().path;
    RegistryOptions ro = make_registry_options(options);
    ro.threads = 1;
    registry = std::make_unique<ModelRegistry>(std::move(sources), ro);
    server = std::make_unique<HttpServer>(options, *registry);
    port = server->bind();
    thread = std::thread([this] { server->serve(); });
    for (int i = 0; i < 200; ++i) {
      httplib::Client c("127.0.0.1", port);
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "server did not come up";
  }
  ~TestServer() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }

  std::unique_ptr<ModelRegistry> registry;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = -1;
};

struct Reply {
  int status = -1;
  std::string body;
  json doc() const { return json::parse(body, nullptr, false); }
};

Reply post(const TestServer& s, const std::string& path, const std::string& body, const httplib::Headers& headers = {}) {
  auto r = s.client().Post(path.c_str(), headers, body, "application/json");
  if (!r) return {};
  return {r->status, r->body};
}

Reply post(const TestServer& s, const std::string& path, const json& body, const httplib::Headers& headers = {}) {
  return post(s, path, body.dump(), headers);
}

Reply get(const TestServer& s, const std::string& path, const httplib::Headers& headers = {}) {
  auto r = s.client().Get(path.c_str(), headers);
  if (!r) return {};
  return {r->status, r->body};
}

// "data: X\n\n" payloads of a server-sent-event body.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// A metric's value from Prometheus text, or -1.
double metric(const std::string& text, const std::string& name_and_labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name_and_labels + " ", 0) == 0) return std::stod(line.substr(name_and_labels.size() + 1));
  return -1;
}

json chat_body(const std::string& user, int max_tokens = 16) {
  return {{"model", "tiny-a"},
          {"messages", json::array({{{"role", "system"}, {"content", "You are a test."}},
                                    {{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// A plain TCP connection for what HTTP clients do not do: stall, hang up.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ADD_FAILURE() << "connect failed";
    timeval tv{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawConnection() { close(); }
  void send(const std::string& data) { (void)!::write(fd_, data.data(), data.size()); }
  void send_post(const std::string& path, const std::string& body) {
    send("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  // Reads until `needle` appears (or timeout/EOF); returns what was read.
  std::string read_until(const std::string& needle) {
    std::string got;
    char buf[4096];
    while (got.find(needle) == std::string::npos) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  // One read: what has arrived (waiting for some), empty on timeout or EOF.
  std::string read_some() {
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------
// Request parsing

TEST(OpenAIRequest, ParsesAFullChatRequest) {
  auto r = parse_chat_completion_request(R"({
    "model": "m", "stream": true, "stream_options": {"include_usage": true},
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 12,
    "min_p": 0.1, "repeat_penalty": 1.1, "seed": 42, "stop": ["a", "", "bc"], "n": 1,
    "logprobs": true, "top_logprobs": 3, "cache_salt": "tenant-1", "user": "u",
    "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "response_format": {"type": "text"},
    "chat_template_kwargs": {"enable_thinking": false}, "unknown_field": [1, 2], "ignore_eos": true,
    "messages": [
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": "result", "tool_call_id": "c1"}
    ]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ChatCompletionRequest& c = r.value();
  EXPECT_EQ(c.options.model, "m");
  EXPECT_TRUE(c.options.stream);
  EXPECT_TRUE(c.options.include_usage);
  EXPECT_EQ(c.options.max_tokens, 7);
  EXPECT_FLOAT_EQ(c.options.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.options.sampling.top_p, 0.9f);
  EXPECT_EQ(c.options.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(c.options.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(c.options.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(c.options.sampling.seed, 42u);
  EXPECT_TRUE(c.options.seed_given);
  EXPECT_EQ(c.options.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(c.options.logprobs);
  EXPECT_EQ(c.options.top_logprobs, 3);
  EXPECT_EQ(c.options.cache_salt, "tenant-1");
  EXPECT_TRUE(c.options.ignore_eos);
  EXPECT_EQ(c.template_kwargs["enable_thinking"], false);
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[0]["role"], "system");
  EXPECT_EQ(c.messages[1]["content"], "one\ntwo");
  EXPECT_TRUE(c.messages[2]["content"].is_null());
  EXPECT_EQ(c.messages[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(c.messages[3]["tool_call_id"], "c1");
  EXPECT_FALSE(c.first_image_message.has_value());
}

TEST(OpenAIRequest, DefaultsAndNulls) {
  auto r = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":"hi"}],"temperature":null,"stop":null,"seed":null})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  SamplingParams defaults;
  EXPECT_EQ(r.value().options.sampling.temperature, defaults.temperature);
  EXPECT_FALSE(r.value().options.seed_given);
  EXPECT_FALSE(r.value().options.max_tokens.has_value());
  EXPECT_FALSE(r.value().options.stream);
  EXPECT_EQ(r.value().options.model, "");
}

TEST(OpenAIRequest, ImagesAreFlaggedNotDropped) {
  auto r = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"look"},
          {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().first_image_message, 1u);
}

TEST(OpenAIRequest, RejectsBadInputWithTheFieldNamed) {
  struct Case {
    const char* body;
    const char* param;  // expected param ("" = null)
  };
  const Case cases[] = {
      {R"({"messages":)", ""},
      {R"([1,2])", ""},
      {R"("str")", ""},
      {R"({})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":{}})", "messages"},
      {R"({"messages":["hi"]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text"},
      {R"({"messages":[{"role":"user","content":[{"type":"input_audio"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":7})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":-1})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":-0.1})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":1.5})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":-3})", "top_k"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":2.5})", "top_k"},
      {R"({"messages":[{"role":"user","content":"x"}],"min_p":2})", "min_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"repeat_penalty":0})", "repeat_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1e300})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":0})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":17})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2.5})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":{"a":1}})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":2.5})", "frequency_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":-3})", "presence_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"x1":5}})", "logit_bias.x1"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"-1":5}})", "logit_bias.-1"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":500}})", "logit_bias.1"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":"5"}})", "logit_bias.1"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":[1]})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":"json"})", "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
          "json_schema":{"name":"x","schema":{"type":"object","minProperties":1}}}})",
       "response_format.json_schema.schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object",
          "schema":{"type":"string","format":"date","pattern":"x"}}})",
       "response_format.schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
          "json_schema":{"name":7,"schema":{}}}})",
       "response_format.json_schema.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"cache_salt":5})", "cache_salt"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}})", "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    auto r = parse_chat_completion_request(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.error().status, 400) << c.body;
    EXPECT_EQ(r.error().param, c.param) << c.body << " -> " << r.error().message;
    EXPECT_FALSE(r.error().message.empty());
  }
}

// A lone UTF-16 surrogate escape (a JavaScript string cut inside an emoji)
// is accepted, as Python's json accepts it, and becomes U+FFFD; pairs and
// escaped backslashes stay as they are.
TEST(OpenAIRequest, LoneSurrogateEscapesBecomeReplacementCharacters) {
  auto content_of = [](const std::string& body) {
    auto r = parse_chat_completion_request(body);
    EXPECT_TRUE(r.ok()) << body << " -> " << (r.ok() ? "" : r.error().message);
    return r.ok() ? r.value().messages[0]["content"].get<std::string>() : std::string();
  };
  auto body = [](const std::string& content) {
    return R"({"messages":[{"role":"user","content":")" + content + R"("}]})";
  };
  EXPECT_EQ(content_of(body("hi \\ud83d")), "hi \xef\xbf\xbd");
  EXPECT_EQ(content_of(body("\\ude00 x \\ud83d\\ude00 \\ud83d")), "\xef\xbf\xbd x \xf0\x9f\x98\x80 \xef\xbf\xbd");
  EXPECT_EQ(content_of(body("\\\\ud83d")), "\\ud83d");  // an escaped backslash, then text
  EXPECT_EQ(content_of(body("\\ud83dx\\u0041")), "\xef\xbf\xbdxA");
  EXPECT_FALSE(parse_chat_completion_request(body("\\ud83") + "}").ok());  // still invalid JSON
}

// OpenAI accepts top_p 0: the most likely token alone.
TEST(OpenAIRequest, AnAssistantsRefusalPartIsItsText) {
  auto r = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"refusal","refusal":"I can't."}]},)"
      R"({"role":"user","content":"why"}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().messages[1]["content"], "I can't.");
  auto user = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"}]}]})");
  EXPECT_FALSE(user.ok());
}

TEST(OpenAIRequest, TopPZeroKeepsTheMostLikelyTokenAlone) {
  auto r = parse_chat_completion_request(R"({"messages":[{"role":"user","content":"x"}],"top_p":0})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  SamplingParams s = r.value().options.sampling;
  EXPECT_EQ(s.validate(), "");
  s.temperature = 1.0f;
  s.top_k = 0;
  s.min_p = 0;
  Sampler sampler(s);
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f};
  const std::vector<float> dist = sampler.distribution(logits, {});
  EXPECT_GT(dist[1], 0.0f);
  EXPECT_EQ(dist[0] + dist[2] + dist[3], 0.0f);
}

TEST(OpenAIRequest, PenaltiesAndLogitBias) {
  auto r = parse_chat_completion_request(
      R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":0.5,"presence_penalty":-0.25,)"
      R"("logit_bias":{"17":-100,"4":2.5}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const SamplingParams& s = r.value().options.sampling;
  EXPECT_EQ(s.frequency_penalty, 0.5f);
  EXPECT_EQ(s.presence_penalty, -0.25f);
  std::vector<std::pair<int32_t, float>> bias = s.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{4, 2.5f}, {17, -100.0f}}));
}

TEST(OpenAIRequest, CompletionPromptForms) {
  auto text = parse_completion_request(R"({"prompt":"hello","logprobs":2})");
  ASSERT_TRUE(text.ok());
  ASSERT_EQ(text.value().prompts.size(), 1u);
  EXPECT_EQ(text.value().prompts[0].text, "hello");
  EXPECT_FALSE(text.value().prompts[0].is_tokens);
  EXPECT_TRUE(text.value().options.logprobs);
  EXPECT_EQ(text.value().options.top_logprobs, 2);
  EXPECT_FALSE(text.value().echo);
  auto one = parse_completion_request(R"({"prompt":["hi"],"echo":true})");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one.value().prompts.size(), 1u);
  EXPECT_EQ(one.value().prompts[0].text, "hi");
  EXPECT_TRUE(one.value().echo);
  auto ids = parse_completion_request(R"({"prompt":[1,5,9]})");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids.value().prompts.size(), 1u);
  EXPECT_TRUE(ids.value().prompts[0].is_tokens);
  EXPECT_EQ(ids.value().prompts[0].tokens, (std::vector<int32_t>{1, 5, 9}));
  auto nested = parse_completion_request(R"({"prompt":[[3,4]]})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested.value().prompts[0].tokens, (std::vector<int32_t>{3, 4}));
  // Batches: several strings, or several token lists.
  auto strings = parse_completion_request(R"({"prompt":["a","b","c"],"n":2})");
  ASSERT_TRUE(strings.ok());
  ASSERT_EQ(strings.value().prompts.size(), 3u);
  EXPECT_EQ(strings.value().prompts[2].text, "c");
  EXPECT_EQ(strings.value().options.choices, 2);
  auto lists = parse_completion_request(R"({"prompt":[[1,2],[3]]})");
  ASSERT_TRUE(lists.ok());
  ASSERT_EQ(lists.value().prompts.size(), 2u);
  EXPECT_EQ(lists.value().prompts[1].tokens, (std::vector<int32_t>{3}));
  std::string too_many = R"({"prompt":[)";
  for (int i = 0; i < 65; ++i) too_many += std::string(i ? "," : "") + "\"p\"";
  too_many += "]}";
  std::string too_many_choices = R"({"prompt":["a","b","c","d","e"],"n":16})";
  struct Bad {
    std::string body, param;
  };
  for (const Bad& bad : std::vector<Bad>{{R"({})", "prompt"},
                                         {R"({"prompt":["a",[1]]})", "prompt[1]"},
                                         {R"({"prompt":[[1],"a"]})", "prompt[1]"},
                                         {R"({"prompt":[[1],[]]})", "prompt[1]"},
                                         {R"({"prompt":["a",5]})", "prompt[1]"},
                                         {R"({"prompt":[]})", "prompt"},
                                         {R"({"prompt":[-1]})", "prompt[0]"},
                                         {R"({"prompt":[[2],[-1]]})", "prompt[1][0]"},
                                         {R"({"prompt":5})", "prompt"},
                                         {R"({"prompt":"x","echo":"yes"})", "echo"},
                                         {R"({"prompt":"x","best_of":3})", "best_of"},
                                         {R"({"prompt":"x","logprobs":9})", "logprobs"},
                                         {R"({"prompt":[1,"a"]})", "prompt[1]"},
                                         {too_many, "prompt"},
                                         {too_many_choices, "n"}}) {
    auto r = parse_completion_request(bad.body);
    EXPECT_FALSE(r.ok()) << bad.body;
    if (!r.ok()) {
      EXPECT_EQ(r.error().status, 400) << bad.body;
      EXPECT_EQ(r.error().param, bad.param) << bad.body;
    }
  }
}

TEST(OpenAIRequest, RefusesDeepNestingBeforeParsing) {
  std::string deep = R"({"messages":[{"role":"user","content":"x"}],"tools":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}";
  auto r = parse_chat_completion_request(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, 400);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[","b":[{}]})", 64), 3);
  EXPECT_EQ(json_nesting_depth(R"("\"[[[")", 64), 0);
}

// Randomized mutations of valid requests: every case either parses or gives a
// 4xx error object; nothing throws. Valid chat requests are also rendered with
// the fallback template and tokenized, which must not throw either.
TEST(OpenAIRequest, MutationFuzz) {
  const std::vector<std::string> seeds = {
      chat_body("hello", 8).dump(),
      R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"t"}]}],"stream":true,"stream_options":{"include_usage":true},"stop":["x","y"],"logprobs":true,"top_logprobs":2,"seed":3,"top_k":5,"min_p":0.1,"cache_salt":"c","tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"k":[1,{"a":null}]}})",
      R"({"prompt":"Once upon a time","max_tokens":4,"temperature":0.7,"top_p":0.5,"stop":"\n","logprobs":1})",
      R"({"prompt":[1,2,3],"stream":false,"seed":-5,"repeat_penalty":1.2})",
      R"({"content":"Hello","add_special":true,"with_pieces":true,"tokens":[1,2]})",
      R"({"prompt":"p","response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","$defs":{"d":{"type":["string","null"],"maxLength":3}},"properties":{"a":{"$ref":"#/$defs/d"},"b":{"type":"array","items":{"enum":[1,"x",null]},"minItems":1,"prefixItems":[{"const":2}]},"c":{"anyOf":[{"type":"integer"},{"nullable":true,"type":"number"}]}},"required":["a"],"additionalProperties":{"type":"boolean"}}}}})",
  };
  const std::vector<json> replacement_values = {
      nullptr, true, false, 0, -1, 1, 2, 1e308, -1e308, 0.5, 4294967296LL, -9223372036854775807LL - 1,
      18446744073709551615ULL, "", "x", "\xff\xfe", std::string(3000, 'z'), json::array(), json::array({1, "a", nullptr}),
      json::object(), json::object({{"type", "text"}}), json::object({{"type", "image_url"}}),
      json::array({json::object({{"role", "user"}, {"content", nullptr}})})};
  const std::vector<std::string> keys = {
      "model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
      "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "seed", "stop", "n", "logprobs", "top_logprobs",
      "cache_salt", "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice", "chat_template_kwargs",
      "role", "content", "type", "text", "include_usage", "echo", "suffix", "best_of", "tool_calls", "name",
      "json_schema", "schema", "$ref", "$defs", "properties", "items", "prefixItems", "required", "enum", "const",
      "anyOf", "allOf", "nullable", "minItems", "maxLength", "additionalProperties", "tokens", "add_special",
      "with_pieces", "parse_special", "pattern", "format"};

  std::mt19937_64 rng(1234);
  test::JsonMutator mutator(rng, replacement_values, keys);
  auto pick = [&](size_t n) { return mutator.pick(n); };
  ModelChatTemplate fallback;
  fallback.chat_template = std::make_unique<ChatTemplate>(kFallbackChatTemplate);
  fallback.origin = "fallback";
  auto mutate = [&](json& doc, int depth) { mutator.mutate(doc, depth); };

  int parsed_ok = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string body;
    json doc = json::parse(seeds[pick(seeds.size())]);
    const int n_mutations = 1 + static_cast<int>(pick(4));
    for (int m = 0; m < n_mutations; ++m) mutate(doc, 0);
    body = doc.dump(-1, ' ', false, json::error_handler_t::replace);
    if (pick(4) == 0) {
      // Byte-level damage too: truncation, a flipped byte, an insertion.
      switch (pick(3)) {
        case 0: body.resize(pick(body.size() + 1)); break;
        case 1:
          if (!body.empty()) body[pick(body.size())] = static_cast<char>(rng());
          break;
        default: body.insert(pick(body.size() + 1), 1, "{}[]\",:\\0"[pick(9)]); break;
      }
    }
    for (bool chat : {true, false}) {
      try {
        if (chat) {
          auto r = parse_chat_completion_request(body);
          if (r.ok()) {
            ++parsed_ok;
            // Rendering and tokenizing a validated request must not throw.
            auto prompt = build_chat_prompt(fallback, tiny_tokenizer(), 4096, r.value());
            if (!prompt.ok()) {
              EXPECT_GE(prompt.error().status, 400);
            }
          } else {
            ++rejected;
            EXPECT_GE(r.error().status, 400) << body;
            EXPECT_LT(r.error().status, 500) << body;
            EXPECT_FALSE(r.error().message.empty());
            EXPECT_FALSE(dump_json(error_json(r.error())).empty());
          }
        } else {
          auto r = parse_completion_request(body);
          if (r.ok()) {
            ++parsed_ok;
            for (const CompletionPrompt& one : r.value().prompts) {
              auto prompt = build_completion_prompt(tiny_tokenizer(), 4096, 1024, one);
              if (!prompt.ok()) {
                EXPECT_EQ(prompt.error().status, 400);
              }
            }
          } else {
            ++rejected;
            EXPECT_GE(r.error().status, 400) << body;
            EXPECT_LT(r.error().status, 500) << body;
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "exception escaped for body " << body << ": " << e.what();
      }
    }
    // The utilities' bodies: parsed, or refused with a 400.
    try {
      auto t = parse_tokenize_request(body);
      if (!t.ok()) {
        EXPECT_EQ(t.error().status, 400) << body;
      }
      auto d = parse_detokenize_request(body);
      if (!d.ok()) {
        EXPECT_EQ(d.error().status, 400) << body;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception escaped for body " << body << ": " << e.what();
    }
  }
  // Both outcomes must actually be exercised.
  EXPECT_GT(parsed_ok, 2000);
  EXPECT_GT(rejected, 8000);
}

// ---------------------------------------------------------------------------
// Stop strings

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out;
}

TEST(StopMatcher, MatchesAcrossPiecesAndHidesTheStopString) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("hello E"), "hello ");  // "E" could start END
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("D and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
}

TEST(StopMatcher, ReleasesHeldTextThatIsNotAMatch) {
  StopMatcher m({"END"});
  EXPECT_EQ(feed(m, {"x E", "N", "x"}), "x ENx");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("EN"), "");
  EXPECT_EQ(m.flush(), "EN");
}

TEST(StopMatcher, EarliestOfSeveralWinsAndUtf8StaysWhole) {
  StopMatcher m({"world", "lo w", "\xc3\xa9t\xc3\xa9"});
  EXPECT_EQ(feed(m, {"hel", "lo", " wor", "ld"}), "hel");
  StopMatcher u({"\xc3\xa9t\xc3\xa9"});  // "été"
  EXPECT_EQ(u.push("caf\xc3\xa9 \xc3\xa9"), "caf\xc3\xa9 ");
  EXPECT_EQ(u.push("t\xc3\xa9!"), "");
  EXPECT_TRUE(u.stopped());
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

// ---------------------------------------------------------------------------
// Response building

TEST(OpenAIResponse, ChatCompletionShape) {
  ResponseMeta meta{"chatcmpl-x", 123, "m", "fp_1"};
  std::vector<LogprobEntry> lp = {{"Hi", -0.5f, {{"Hi", -0.5f}, {"Yo", -1.5f}}}};
  json j = json::parse(dump_json(chat_completion_json(meta, "Hi", "stop", lp, {10, 4, 2})));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Yo");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["bytes"], json::array({72, 105}));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);

  json chunk = json::parse(dump_json(chat_chunk_json(meta, {{"content", "a"}}, "", std::nullopt, true)));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null());
  json usage = json::parse(dump_json(chat_usage_chunk_json(meta, {1, 0, 1})));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 2);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(OpenAIResponse, CompletionShapeAndLegacyLogprobs) {
  ResponseMeta meta{"cmpl-x", 1, "m", ""};
  std::vector<LogprobEntry> lp = {{"a", -1.0f, {{"a", -1.0f}}}, {"bc", -2.0f, {{"bc", -2.0f}}}};
  json j = json::parse(dump_json(completion_json(meta, "abc", "length", lp, {3, 0, 2})));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "abc");
  EXPECT_TRUE(j["system_fingerprint"].is_null());
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"], json::array({"a", "bc"}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({0, 1}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][1]["bc"], -2.0);

  // Offsets count characters: "é" is two bytes, one character; a character
  // split over two tokens counts in the first.
  std::vector<LogprobEntry> wide = {{"\xc3\xa9", -1.0f, {}}, {"x", -1.0f, {}}, {"\xe0\xbd", -1.0f, {}},
                                    {"\x85y", -1.0f, {}}, {"z", -1.0f, {}}};
  json w = json::parse(dump_json(completion_logprobs_json(wide, 3)));
  EXPECT_EQ(w["text_offset"], json::array({3, 4, 5, 6, 7}));
  // The chosen token is in its top_logprobs dict even when not among the top.
  std::vector<LogprobEntry> outside = {{"x", -3.0f, {{"a", -0.5f}, {"b", -1.0f}}}, {"y", -0.1f, {}}};
  json o = json::parse(dump_json(completion_logprobs_json(outside)));
  EXPECT_EQ(o["top_logprobs"][0], json({{"a", -0.5}, {"b", -1.0}, {"x", -3.0}}));
  EXPECT_EQ(o["top_logprobs"][1], json({{"y", -0.1f}}));
  EXPECT_EQ(utf8_characters("h\xc3\xa9llo \xf0\x9f\x98\x80"), 7u);
}

TEST(OpenAIResponse, ErrorsAndInvalidUtf8) {
  json e = json::parse(dump_json(error_json(ApiError::invalid("bad", "messages"))));
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "messages");
  EXPECT_TRUE(e["error"]["code"].is_null());
  // A token can end inside a UTF-8 character; serialisation must not throw.
  std::string s = dump_json(chat_completion_json({"i", 0, "m", ""}, "ok \xe2\x82", "stop", std::nullopt, {}));
  EXPECT_NE(s.find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_NE(make_response_id("chatcmpl-"), make_response_id("chatcmpl-"));
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.record_request("a\"b", "chat_completions", 200);
  m.record_tokens("a\"b", 10, 4, 3);
  ModelStatus s;
  s.id = "a\"b";
  s.loaded = true;
  s.cache.hits = 7;
  s.cache.blocks_in_use = 2;
  std::string text = m.prometheus({s}, {4, 1, 2}, 3);
  EXPECT_NE(text.find("# TYPE reprise_requests_total counter"), std::string::npos);
  EXPECT_EQ(metric(text, R"(reprise_requests_total{model="a\"b",endpoint="chat_completions",status="200"})"), 1);
  EXPECT_EQ(metric(text, R"(reprise_cached_prompt_tokens_total{model="a\"b"})"), 4);
  EXPECT_EQ(metric(text, R"(reprise_cache_hits_total{model="a\"b"})"), 7);
  EXPECT_EQ(metric(text, R"(reprise_cache_blocks{model="a\"b",state="in_use"})"), 2);
  EXPECT_EQ(metric(text, "reprise_queue_depth"), 1);
  EXPECT_EQ(metric(text, "reprise_sequences_active"), 2);
  EXPECT_EQ(prometheus_label_value("a\\b\n"), "a\\\\b\\n");
}

// ---------------------------------------------------------------------------
// Prompts and templates

ChatCompletionRequest one_user_message(const std::string& text) {
  auto r = parse_chat_completion_request(json{{"messages", {{{"role", "user"}, {"content", text}}}}}.dump());
  EXPECT_TRUE(r.ok());
  return r.value();
}

ModelChatTemplate template_from(const std::string& source) {
  ModelChatTemplate t;
  t.chat_template = std::make_unique<ChatTemplate>(source);
  t.origin = "file";
  t.bos_token = tiny_tokenizer().token_text(tiny_tokenizer().bos_id());
  probe_chat_template(t, tiny_tokenizer().add_bos());
  return t;
}

// OpenAI clients send a tool call's arguments as a JSON string; a template
// that prints them with `| tojson` (Qwen2.5's, Llama 3.1's) needs the object,
// or the prompt shows the string quoted and escaped. Templates that handle
// strings themselves get them as sent.
TEST(PromptBuilder, ToolCallArgumentsReachTemplatesInTheFormTheyPrint) {
  const std::string loop = "{% for m in messages %}{% for c in m.tool_calls or [] %}[";
  const std::string end = "]{% endfor %}{% endfor %}";
  ModelChatTemplate as_json = template_from(loop + "{{ c.function.arguments | tojson }}" + end);
  ModelChatTemplate either = template_from(
      loop + "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}"
             "{{ c.function.arguments | tojson }}{% endif %}" + end);
  ModelChatTemplate concatenated = template_from(loop + "{{ 'args: ' + c.function.arguments }}" + end);
  EXPECT_TRUE(as_json.wants_object_arguments);
  EXPECT_FALSE(either.wants_object_arguments);
  EXPECT_FALSE(concatenated.wants_object_arguments);

  ChatCompletionRequest request;
  request.messages = json::array(
      {{{"role", "user"}, {"content", "weather?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "c1"},
                                     {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}},
                                    {{"id", "c2"},
                                     {"type", "function"},
                                     {"function", {{"name", "f"}, {"arguments", "not json"}}}}})}}});
  auto rendered = [&](const ModelChatTemplate& t) {
    auto r = render_chat_prompt(t, tiny_tokenizer(), request);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r.value() : std::string();
  };
  EXPECT_EQ(rendered(as_json), "[{\"city\": \"Paris\"}][\"not json\"]");
  EXPECT_EQ(rendered(either), "[{\"city\": \"Paris\"}][not json]");
  EXPECT_EQ(rendered(concatenated), "[args: {\"city\": \"Paris\"}][args: not json]");
}

TEST(PromptBuilder, NeverDoublesBos) {
  const Tokenizer& tok = tiny_tokenizer();
  ASSERT_TRUE(tok.add_bos());
  for (const char* source : {"{{ bos_token }}{{ messages[0]['content'] }}", "{{ messages[0]['content'] }}"}) {
    auto p = build_chat_prompt(template_from(source), tok, 4096, one_user_message("hello"));
    ASSERT_TRUE(p.ok()) << p.error().message;
    ASSERT_GE(p.value().tokens.size(), 2u);
    EXPECT_EQ(p.value().tokens[0], tok.bos_id()) << source;
    EXPECT_NE(p.value().tokens[1], tok.bos_id()) << source;
  }
}

TEST(PromptBuilder, TemplateErrorsAndContextLength) {
  const Tokenizer& tok = tiny_tokenizer();
  auto raised = build_chat_prompt(template_from("{{ raise_exception('roles must alternate') }}"), tok, 4096,
                                  one_user_message("x"));
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.error().status, 400);
  EXPECT_NE(raised.error().message.find("roles must alternate"), std::string::npos);

  ModelChatTemplate broken;
  broken.origin = "gguf";
  broken.error = "unexpected end of template";
  auto b = build_chat_prompt(broken, tok, 4096, one_user_message("x"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().status, 500);
  EXPECT_NE(b.error().message.find("unexpected end of template"), std::string::npos);

  auto too_long = build_chat_prompt(template_from("{{ messages[0]['content'] }}"), tok, 16,
                                    one_user_message(std::string(200, 'a') + " b c d e f g"));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, "context_length_exceeded");
}

TEST(PromptBuilder, FallbackTemplateIsChatMLAndAppendStable) {
  ChatTemplate fallback(kFallbackChatTemplate);
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}});
  EXPECT_EQ(fallback.apply(in),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  in.messages.push_back({{"role", "assistant"}, {"content", "A"}});
  in.messages.push_back({{"role", "user"}, {"content", "V"}});
  EXPECT_TRUE(is_append_stable(fallback, in.messages));
}

// docs/server.md says, per fixture template, whether a multi-turn chat can
// reuse the previous turn from the prefix cache: the previous prompt (with
// its generation prompt) must be a prefix of the next one, and the reply the
// model generated must be rendered back verbatim after it. Templates that
// drop earlier reasoning fail the second; this keeps the document true.
TEST(PromptBuilder, DocumentedAppendStabilityOfFixtureTemplates) {
  REPRISE_REQUIRE_SHARED(fixtures);
  const std::set<std::string> documented_prompt_unstable = {
      "LFM2.5-Instruct", "NVIDIA-Nemotron-Nano-v2", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
      "mistralai-Mistral-Nemo-Instruct-2407"};
  const std::set<std::string> documented_reply_rewritten = {"Qwen-Qwen3-0.6B", "openai-gpt-oss-120b"};
  // Three turns, so templates that treat the latest reply differently from
  // older ones (keeping only the last one's reasoning) show it.
  const std::vector<std::string> replies = {"<think>\nAdd them.\n</think>\n\n4", "<think>\nAgain.\n</think>\n\n6"};
  std::vector<nlohmann::ordered_json> turns(3);
  turns[0] = nlohmann::ordered_json::array(
      {{{"role", "system"}, {"content", "You are helpful."}}, {{"role", "user"}, {"content", "What is 2+2?"}}});
  turns[1] = turns[0];
  turns[1].push_back({{"role", "assistant"}, {"content", replies[0]}});
  turns[1].push_back({{"role", "user"}, {"content", "And 3+3?"}});
  turns[2] = turns[1];
  turns[2].push_back({{"role", "assistant"}, {"content", replies[1]}});
  turns[2].push_back({{"role", "user"}, {"content", "Thanks"}});
  std::set<std::string> prompt_unstable, reply_rewritten;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures + "/templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().stem().string();
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    ChatTemplate t(ss.str());
    ChatTemplateInputs inputs;
    inputs.bos_token = "<s>";
    inputs.eos_token = "</s>";
    jinja::RenderOptions options;
    options.now = [] { return std::time_t{1795219200}; };  // fixed clock
    std::vector<std::string> prompts;
    for (const auto& messages : turns) {
      inputs.messages = messages;
      prompts.push_back(t.apply(inputs, options));
    }
    for (size_t k = 0; k + 1 < prompts.size(); ++k) {
      if (!prompts[k + 1].starts_with(prompts[k])) prompt_unstable.insert(name);
      else if (prompts[k + 1].compare(prompts[k].size(), replies[k].size(), replies[k]) != 0)
        reply_rewritten.insert(name);
    }
  }
  EXPECT_EQ(prompt_unstable, documented_prompt_unstable);
  EXPECT_EQ(reply_rewritten, documented_reply_rewritten);
}

// ---------------------------------------------------------------------------
// Loopback HTTP

TEST(ServeHttp, HealthModelsAndCacheStats) {
  TestServer s;
  Reply h = get(s, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.doc()["status"], "ok");
  json models = get(s, "/v1/models").doc();
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny-a");
  EXPECT_EQ(models["data"][1]["id"], "tiny-b");
  EXPECT_EQ(get(s, "/v1/models/tiny-b").doc()["id"], "tiny-b");
  EXPECT_EQ(get(s, "/models/tiny-b").doc()["id"], "tiny-b");
  EXPECT_EQ(get(s, "/v1/models/nope").status, 404);
  json stats = get(s, "/v1/cache/stats").doc();
  ASSERT_EQ(stats["models"].size(), 2u);
  EXPECT_TRUE(stats["totals"].contains("hits"));
}

// A reply is several small writes (headers, body): with Nagle's algorithm
// each reply on a kept-alive connection waited for the client's delayed ACK
// (40 ms or more on Linux) before its last write went out.
TEST(ServeHttp, KeptAliveRepliesAreNotHeldForDelayedAcks) {
  TestServer s;
  // The server keeps a connection for 5 requests (cpp-httplib's default).
  constexpr int kConnections = 4, kRepliesEach = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int conn = 0; conn < kConnections; ++conn) {
    RawConnection c(s.port);
    std::string got;  // what has arrived and is not yet consumed
    for (int i = 0; i < kRepliesEach; ++i) {
      c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
      got += c.read_until("\r\n\r\n");
      const size_t head_end = got.find("\r\n\r\n");
      ASSERT_NE(head_end, std::string::npos) << "reply " << i << ": " << got;
      ASSERT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
      std::smatch m;
      const std::string head = got.substr(0, head_end);
      ASSERT_TRUE(std::regex_search(head, m, std::regex("Content-Length: ([0-9]+)", std::regex::icase))) << head;
      const size_t end = head_end + 4 + std::stoul(m[1].str());
      while (got.size() < end) {
        const std::string more = c.read_some();
        ASSERT_FALSE(more.empty()) << "the connection ended inside reply " << i;
        got += more;
      }
      ASSERT_NE(got.substr(head_end, end - head_end).find("\"ok\""), std::string::npos) << got;
      got.erase(0, end);
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 400ms)
      << kConnections * (kRepliesEach - 1) << " waits for delayed ACKs took ~520 ms in all here";
}

TEST(ServeHttp, ChatCompletionNonStreamingAndStreamingAgree) {
  TestServer s;
  json body = chat_body("Tell me a story", 24);
  body["seed"] = 7;
  Reply plain = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  json j = plain.doc();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny-a");
  const std::string text = j["choices"][0]["message"]["content"];
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 5);
  EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 24);
  EXPECT_EQ(j["usage"]["total_tokens"],
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply streamed = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200);
  std::vector<std::string> events = sse_payloads(streamed.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string joined;
  std::string stream_finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["id"], first["id"]);
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    EXPECT_TRUE(e.contains("usage"));  // null on every chunk but the last
    const json& delta = e["choices"][0]["delta"];
    if (delta.contains("content")) joined += delta["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) stream_finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(stream_finish, finish);
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], j["usage"]["completion_tokens"]);
  // The second, identical prompt came from the cache.
  EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), j["usage"]["prompt_tokens"].get<int>() - 1);
}

// llama.cpp's utilities: /tokenize is the model's tokenizer (with BOS on
// request, pieces on request), /detokenize its inverse, /apply-template the
// prompt a chat completion computes (its tokens are the completion's
// prompt_tokens).
TEST(ServeHttpUtilities, TokenizeDetokenizeAndApplyTemplate) {
  TestServer s;
  const std::string text = "Hello world, once upon a time";
  const json plain = post(s, "/tokenize", json{{"content", text}}).doc();
  const std::vector<int32_t> want = tiny_tokenizer().encode(text, false, true);
  EXPECT_EQ(plain["tokens"].get<std::vector<int32_t>>(), want);
  const json with_bos = post(s, "/tokenize", json{{"content", text}, {"add_special", true}, {"model", "tiny-b"}}).doc();
  ASSERT_EQ(with_bos["tokens"].size(), want.size() + 1);
  EXPECT_EQ(with_bos["tokens"][0], tiny_tokenizer().bos_id());
  const json pieces = post(s, "/tokenize", json{{"content", text}, {"with_pieces", true}}).doc();
  ASSERT_EQ(pieces["tokens"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(pieces["tokens"][i]["id"], want[i]);
    EXPECT_EQ(pieces["tokens"][i]["piece"], tiny_tokenizer().token_to_piece(want[i], true));
  }
  EXPECT_EQ(post(s, "/detokenize", json{{"tokens", want}}).doc()["content"], text);
  // Pieces that are not whole UTF-8 (byte tokens of one character) come as their bytes.
  const json bytes = post(s, "/tokenize", json{{"content", "\xE2\x82\xAC"}, {"with_pieces", true}}).doc();
  std::string joined;
  bool any_bytes = false;
  for (const json& t : bytes["tokens"]) {
    if (t["piece"].is_array()) {
      any_bytes = true;
      for (int b : t["piece"]) joined += static_cast<char>(b);
    } else {
      joined += t["piece"].get<std::string>();
    }
  }
  EXPECT_TRUE(any_bytes) << bytes.dump();
  std::string pieces_joined;
  for (int32_t id : tiny_tokenizer().encode("\xE2\x82\xAC", false, true))
    pieces_joined += tiny_tokenizer().token_to_piece(id, true);
  EXPECT_EQ(joined, pieces_joined);
  EXPECT_NE(joined.find("\xE2\x82\xAC"), std::string::npos);
  Reply bad = post(s, "/detokenize", json{{"tokens", {5, 99999}}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.doc()["error"]["param"], "tokens[1]");
  EXPECT_EQ(post(s, "/tokenize", json{{"text", "x"}}).status, 400);
  EXPECT_EQ(post(s, "/tokenize", std::string("{not json")).status, 400);
  EXPECT_EQ(post(s, "/tokenize", json{{"content", "x"}, {"model", "nope"}}).status, 404);

  const json chat = chat_body("What is two and two?", 4);
  const json rendered = post(s, "/apply-template", chat).doc();
  ASSERT_TRUE(rendered["prompt"].is_string()) << rendered.dump();
  const std::string prompt = rendered["prompt"];
  EXPECT_NE(prompt.find("What is two and two?"), std::string::npos);
  const json completion = post(s, "/v1/chat/completions", chat).doc();
  EXPECT_EQ(completion["usage"]["prompt_tokens"], tokenize_prompt(tiny_tokenizer(), prompt).size());
  EXPECT_EQ(post(s, "/apply-template", json{{"messages", "hi"}}).status, 400);
  const json image = {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"},
                                                                      {"image_url", {{"url", "data:,"}}}}}}}}}};
  Reply no_vision = post(s, "/apply-template", image);
  EXPECT_EQ(no_vision.status, 400);
  EXPECT_EQ(no_vision.doc()["error"]["code"], "images_not_supported");
  EXPECT_GE(metric(get(s, "/metrics").body, R"(reprise_requests_total{model="tiny-a",endpoint="tokenize",status="200"})"), 2);
}

// n choices: each is the reply its seed (the request's plus its index)
// gives alone on a cold cache, and the prompt is computed once: the other
// choices read it from the cache.
TEST(ServeHttpChoices, EachChoiceIsWhatItsSeedGivesAloneAndThePromptIsComputedOnce) {
  std::string prompt = "Once upon a time there was a";
  for (int i = 0; i < 12; ++i) prompt += " little story about a cat number " + std::to_string(i);
  json body = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0.9}, {"seed", 50}, {"n", 4}};
  ServeOptions options;
  options.parallel = 3;  // three at once, the fourth queued
  TestServer s(options);
  Reply reply = post(s, "/v1/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json j = reply.doc();
  ASSERT_EQ(j["choices"].size(), 4u);
  std::set<std::string> distinct;
  int64_t completion_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    distinct.insert(c["text"].get<std::string>());
    // Alone, on a cold cache (a salt of its own), with the choice's seed.
    json alone = body;
    alone.erase("n");
    alone["seed"] = 50 + i;
    alone["cache_salt"] = "cold-" + std::to_string(i);
    Reply single = post(s, "/v1/completions", alone);
    ASSERT_EQ(single.status, 200) << single.body;
    const json sj = single.doc();
    EXPECT_EQ(sj["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(c["text"], sj["choices"][0]["text"]) << "choice " << i;
    EXPECT_EQ(c["finish_reason"], sj["choices"][0]["finish_reason"]) << "choice " << i;
    EXPECT_EQ(j["usage"]["prompt_tokens"], sj["usage"]["prompt_tokens"]);
    completion_tokens += sj["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_GE(distinct.size(), 2u) << "four sampled choices all alike";
  // The prompt once, the completions summed, nothing cached before the request.
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // The cache: of the four sequences' prompts, three were read back from
  // the first one's blocks (all but the part after the last full block).
  const json stats = json::parse(get(s, "/v1/cache/stats").body);
  const int64_t block = stats["models"][0]["block_tokens"];
  const int64_t prompt_tokens = j["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 2 * block);
  // The four cold singles used other salts, so they neither hit nor were hit.
  EXPECT_GE(stats["totals"]["tokens_reused"].get<int64_t>(), 3 * (prompt_tokens - block));

  // n=1 and no n are the same request.
  json one = body;
  one["n"] = 1;
  Reply r1 = post(s, "/v1/completions", one);
  ASSERT_EQ(r1.status, 200);
  EXPECT_EQ(r1.doc()["choices"].size(), 1u);
  EXPECT_EQ(r1.doc()["choices"][0]["text"], j["choices"][0]["text"]);
}

// A copy of a model whose vocabulary cannot write `byte`: every token
// holding it, and its byte token, become unused placeholders.
std::string model_without_byte(const std::string& path, char byte, const std::string& out) {
  auto f = gguf::File::open(path);
  char byte_token[8];
  std::snprintf(byte_token, sizeof byte_token, "<0x%02X>", static_cast<unsigned char>(byte));
  const gguf::Value& tokens = *f->find("tokenizer.ggml.tokens");
  std::vector<std::string> kept;
  std::set<size_t> gone;
  for (size_t i = 0; i < tokens.strings.size(); ++i) {
    const std::string t(tokens.strings[i]);
    if (t.find(byte) != std::string::npos || t == byte_token) {
      gone.insert(i);
      kept.push_back("<gone" + std::to_string(i) + ">");
    } else {
      kept.push_back(t);
    }
  }
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata()) {
    if (key == "tokenizer.ggml.tokens") {
      w.set(key, gguf::MetaValue::string_array(kept));
    } else if (key == "tokenizer.ggml.token_type") {
      std::vector<int32_t> types(value.count);
      std::memcpy(types.data(), value.elems, types.size() * sizeof(int32_t));
      for (size_t i : gone) types[i] = 5;  // UNUSED
      w.set(key, gguf::MetaValue::array(std::span<const int32_t>(types)));
    } else {
      w.set(key, gguf::MetaValue::copy_of(value));
    }
  }
  for (const auto& t : f->tensors()) w.add_tensor_view(t.name, t.shape, t.type, std::span<const uint8_t>(t.data, t.n_bytes));
  w.write(out);
  return out;
}

// A choice that fails (structured output the vocabulary cannot write)
// fails the request at once: its sibling choices are cancelled rather than
// run to their end for a reply that is an error.
TEST(ServeHttpChoices, AFailingChoiceCancelsItsSiblings) {
  const std::string path = model_without_byte(model_a_path(), 'b', ::testing::TempDir() + "/reprise-no-b.gguf");
  ServeOptions options;
  options.parallel = 2;
  TestServer s(options, {{"no-b", path}});
  // A quoted "ab" the vocabulary cannot finish, or a long array of integers.
  const json schema = {{"anyOf",
                        {{{"const", "ab"}},
                         {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 150}, {"maxItems", 150}}}}};
  auto request = [&](uint64_t seed, int n) {
    return json{{"prompt", "Numbers:"},
                {"max_tokens", 1500},
                {"temperature", 1.0},
                {"seed", seed},
                {"n", n},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
  };
  // Find a seed whose reply fails at once and whose next one runs long.
  std::optional<uint64_t> found;
  int64_t long_run = 0;
  for (uint64_t seed = 1; seed < 60 && !found; ++seed) {
    if (post(s, "/v1/completions", request(seed, 1)).status != 400) continue;
    Reply next = post(s, "/v1/completions", request(seed + 1, 1));
    if (next.status != 200) continue;
    long_run = next.doc()["usage"]["completion_tokens"];
    if (long_run >= 300) found = seed;
  }
  ASSERT_TRUE(found.has_value()) << "no seed pair found";
  const double before = metric(get(s, "/metrics").body, R"(reprise_completion_tokens_total{model="no-b"})");
  Reply both = post(s, "/v1/completions", request(*found, 2));
  EXPECT_EQ(both.status, 400) << both.body;
  EXPECT_NE(both.doc()["error"]["message"].get<std::string>().find("structured output"), std::string::npos);
  const double spent = metric(get(s, "/metrics").body, R"(reprise_completion_tokens_total{model="no-b"})") - before;
  EXPECT_LT(spent, static_cast<double>(long_run) / 2) << "the sibling ran on after the failure";
  // Streamed: an error event, and no finish for the cancelled sibling.
  json streamed = request(*found, 2);
  streamed["stream"] = true;
  const std::vector<std::string> events = sse_payloads(post(s, "/v1/completions", streamed).body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(json::parse(events[events.size() - 2]).contains("error")) << events[events.size() - 2];
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Streamed choices: every chunk names its choice, each choice opens with
// the role and ends with one finish_reason, and its text is what the whole
// reply holds; the usage chunk counts all of them.
TEST(ServeHttpChoices, StreamedChoicesAreTheCompleteReplysChoices) {
  TestServer s;
  json body = {{"messages", {{{"role", "user"}, {"content", "Tell me three things."}}}},
               {"max_tokens", 12},
               {"temperature", 1.0},
               {"seed", 7},
               {"n", 3},
               {"logprobs", true},
               {"top_logprobs", 2}};
  Reply whole = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json j = whole.doc();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["role"], "assistant");
    ASSERT_TRUE(j["choices"][i]["logprobs"]["content"].is_array());
    EXPECT_GE(j["choices"][i]["logprobs"]["content"].size(), 1u);
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply streamed = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200);
  const std::vector<std::string> events = sse_payloads(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::string> text(3), finish(3);
  std::vector<int> roles(3, 0), finishes(3, 0);
  std::vector<size_t> logprob_tokens(3, 0);
  json usage;
  for (size_t e = 0; e + 1 < events.size(); ++e) {
    const json chunk = json::parse(events[e]);
    EXPECT_EQ(chunk["id"], json::parse(events[0])["id"]);
    if (chunk["choices"].empty()) {
      usage = chunk["usage"];
      continue;
    }
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const json& c = chunk["choices"][0];
    const int i = c["index"];
    ASSERT_TRUE(i >= 0 && i < 3) << chunk.dump();
    EXPECT_EQ(finishes[i], 0) << "a chunk after choice " << i << " finished";
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
    if (c["logprobs"].is_object()) logprob_tokens[i] += c["logprobs"]["content"].size();
    if (!c["finish_reason"].is_null()) {
      ++finishes[i];
      finish[i] = c["finish_reason"];
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_EQ(text[i], j["choices"][i]["message"]["content"]) << i;
    EXPECT_EQ(finish[i], j["choices"][i]["finish_reason"]) << i;
    EXPECT_EQ(logprob_tokens[i], j["choices"][i]["logprobs"]["content"].size()) << i;
  }
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], j["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["prompt_tokens"], j["usage"]["prompt_tokens"]);
  // The same prompt again: every choice's prompt came from the cache.
  EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            j["usage"]["prompt_tokens"].get<int64_t>() - 1);

  // Text completions stream their choices the same way.
  json completion = {{"prompt", "The cat"}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 3}, {"n", 2}};
  const json whole_completion = post(s, "/v1/completions", completion).doc();
  completion["stream"] = true;
  std::vector<std::string> streamed_text(2);
  for (const std::string& e : sse_payloads(post(s, "/v1/completions", completion).body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    streamed_text[chunk["choices"][0]["index"].get<int>()] += chunk["choices"][0]["text"].get<std::string>();
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(streamed_text[i], whole_completion["choices"][i]["text"]) << i;
}

// echo: the reply starts with the prompt; with logprobs, so do the
// logprobs (the first token's null), computed from the prompt's own
// positions: a continuation's echoed logprobs are the ones its generation
// had (to rounding: a prompt's positions are one batch), and a warm cache
// gives what a cold server gives.
// An echoed token-id prompt is its tokens' pieces joined (no clean-up).
std::string pieces(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += tiny_tokenizer().token_to_piece(id);
  return text;
}

TEST(ServeHttpEcho, EchoedLogprobsAreEachPositionsOwnAndCachedEqualsCold) {
  const std::vector<int32_t> prompt =
      tokenize_prompt(tiny_tokenizer(), "Once upon a time there was a little dog who liked to run");
  ASSERT_GT(prompt.size(), 8u);
  const json echo = {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 3}};
  std::string cold_body;
  {
    TestServer cold;
    Reply r = post(cold, "/v1/completions", echo);
    ASSERT_EQ(r.status, 200) << r.body;
    cold_body = r.body;
    const json e = r.doc();
    const json& c = e["choices"][0];
    EXPECT_EQ(c["text"], pieces(prompt));
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_EQ(e["usage"]["completion_tokens"], 0);
    EXPECT_EQ(e["usage"]["prompt_tokens"], prompt.size());
    const json& lp = c["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), prompt.size());
    ASSERT_EQ(lp["token_logprobs"].size(), prompt.size());
    ASSERT_EQ(lp["top_logprobs"].size(), prompt.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    const std::string text = c["text"];
    for (size_t k = 1; k < prompt.size(); ++k) {
      EXPECT_EQ(lp["tokens"][k], tiny_tokenizer().token_to_piece(prompt[k])) << k;
      // The text is the pieces: each token's offset finds it there.
      const std::string piece = lp["tokens"][k];
      EXPECT_EQ(text.substr(lp["text_offset"][k].get<size_t>(), piece.size()), piece) << k;
      ASSERT_TRUE(lp["token_logprobs"][k].is_number()) << k;
      EXPECT_LE(lp["token_logprobs"][k].get<double>(), 0.0);
      EXPECT_GE(lp["top_logprobs"][k].size(), 3u);  // 3 alternatives, and the token itself
    }
    // Position k's logprob is what the prompt cut before k gives token k:
    // a one-token completion of the cut prompt, forced to that token by
    // logit_bias (logprobs are the model's own, before any bias).
    for (size_t k : {size_t{1}, prompt.size() / 2, prompt.size() - 1}) {
      json forced = {{"prompt", std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(k))},
                     {"max_tokens", 1},
                     {"temperature", 0},
                     {"logprobs", 1},
                     {"logit_bias", {{std::to_string(prompt[k]), 100}}}};
      const json f = post(cold, "/v1/completions", forced).doc();
      const json& flp = f["choices"][0]["logprobs"];
      ASSERT_EQ(flp["tokens"][0], lp["tokens"][k]) << k;
      EXPECT_NEAR(flp["token_logprobs"][0].get<double>(), lp["token_logprobs"][k].get<double>(), 2e-3) << k;
    }
  }
  // A warm server (the prompt's blocks cached): the same bytes.
  TestServer warm;
  ASSERT_EQ(post(warm, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}).status, 200);
  Reply again = post(warm, "/v1/completions", echo);
  ASSERT_EQ(again.status, 200);
  const json a = again.doc(), b = json::parse(cold_body);
  EXPECT_EQ(a["choices"], b["choices"]);
  EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // echo with logprobs reuses nothing
  // ... and it filled the cache: the prompt again reuses it.
  const json after = post(warm, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}).doc();
  EXPECT_GT(after["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  // Echo without logprobs reuses the cache like any request.
  json echo_text = {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}};
  const json with_echo = post(warm, "/v1/completions", echo_text).doc();
  echo_text.erase("echo");
  const json without = post(warm, "/v1/completions", echo_text).doc();
  EXPECT_EQ(with_echo["choices"][0]["text"].get<std::string>(),
            pieces(prompt) + without["choices"][0]["text"].get<std::string>());
  EXPECT_GT(with_echo["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
}

// A model with padding rows beyond its tokenizer's tokens: a prompt may
// name them (they are valid model inputs), and echo shows them as empty
// text, as generated text does, instead of failing.
TEST(ServeHttpEcho, IdsBeyondTheTokenizerEchoAsEmptyText) {
  SyntheticModelSpec spec = synthetic_preset("tiny");
  spec.tokenizer_tokens = 1000;  // of 1024 rows
  const std::string path = test::synthetic_model("server-padded-vocab", spec).path;
  TestServer s({}, {{"padded", path}});
  for (bool logprobs : {false, true}) {
    json body = {{"prompt", {5, 1010, 6}}, {"max_tokens", 2}, {"temperature", 0}, {"echo", true}};
    if (logprobs) body["logprobs"] = 1;
    Reply r = post(s, "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = r.doc()["choices"][0];
    EXPECT_EQ(c["text"].get<std::string>().rfind(pieces({5}) + pieces({6}), 0), 0u) << c.dump();
    if (logprobs) {
      EXPECT_EQ(c["logprobs"]["tokens"][1], "");
      EXPECT_TRUE(c["logprobs"]["token_logprobs"][1].is_number());
    }
  }
}

// Streamed echo: the prompt's text and logprobs come first, and the
// stream's text, tokens and offsets are the complete reply's.
TEST(ServeHttpEcho, StreamedEchoIsTheCompleteReply) {
  TestServer s;
  json body = {{"prompt", "The little cat sat"}, {"max_tokens", 6}, {"temperature", 0.7}, {"seed", 9},
               {"echo", true}, {"logprobs", 2}};
  const json whole = post(s, "/v1/completions", body).doc();
  const json& c = whole["choices"][0];
  ASSERT_TRUE(c["text"].get<std::string>().rfind("The little cat sat", 0) == 0) << c["text"];
  body["stream"] = true;
  std::string text;
  json tokens = json::array(), offsets = json::array(), token_logprobs = json::array();
  bool first = true;
  for (const std::string& e : sse_payloads(post(s, "/v1/completions", body).body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& ch = chunk["choices"][0];
    if (first) {
      EXPECT_EQ(ch["text"], "The little cat sat");
    }
    first = false;
    text += ch["text"].get<std::string>();
    if (ch["logprobs"].is_object())
      for (size_t k = 0; k < ch["logprobs"]["tokens"].size(); ++k) {
        tokens.push_back(ch["logprobs"]["tokens"][k]);
        offsets.push_back(ch["logprobs"]["text_offset"][k]);
        token_logprobs.push_back(ch["logprobs"]["token_logprobs"][k]);
      }
  }
  EXPECT_EQ(text, c["text"]);
  EXPECT_EQ(tokens, c["logprobs"]["tokens"]);
  EXPECT_EQ(offsets, c["logprobs"]["text_offset"]);
  EXPECT_EQ(token_logprobs, c["logprobs"]["token_logprobs"]);
}

// A batch of prompts: choice index = prompt * n + choice, each the reply its
// prompt and seed give alone; usage sums the prompts.
TEST(ServeHttpBatch, EachPromptsChoicesAreWhatTheyGiveAlone) {
  TestServer s;
  const std::vector<std::string> prompts = {"One day a bird", "The moon was", "Tim and Sue went to"};
  json body = {{"prompt", prompts}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 21}, {"n", 2}};
  const json batch = post(s, "/v1/completions", body).doc();
  ASSERT_EQ(batch["choices"].size(), 6u) << batch.dump();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (int c = 0; c < 2; ++c) {
      const json& choice = batch["choices"][p * 2 + c];
      EXPECT_EQ(choice["index"], p * 2 + c);
      const json alone = post(s, "/v1/completions",
                              json{{"prompt", prompts[p]}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 21 + c},
                                   {"cache_salt", "alone"}})
                             .doc();
      EXPECT_EQ(choice["text"], alone["choices"][0]["text"]) << "prompt " << p << " choice " << c;
      if (c == 0) prompt_tokens += alone["usage"]["prompt_tokens"].get<int64_t>();
      completion_tokens += alone["usage"]["completion_tokens"].get<int64_t>();
    }
  EXPECT_EQ(batch["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(batch["usage"]["completion_tokens"], completion_tokens);
  // A bad prompt in the batch names itself.
  Reply bad = post(s, "/v1/completions", json{{"prompt", json::array({json::array({1, 2}), json::array({99999})})}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.doc()["error"]["param"], "prompt[1]");
}

TEST(ServeHttp, CompletionsStreamingMatchesNonStreaming) {
  TestServer s;
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
  Reply plain = post(s, "/v1/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  json j = plain.doc();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny-a");  // default model
  body["stream"] = true;
  Reply streamed = post(s, "/v1/completions", body);
  std::vector<std::string> events = sse_payloads(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string joined, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    joined += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(joined, j["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, j["choices"][0]["finish_reason"].get<std::string>());
}

TEST(ServeHttp, LogprobsAndStopStringsAcrossTokens) {
  TestServer s;
  json body = {{"prompt", "The quick brown"}, {"max_tokens", 24}, {"temperature", 0}, {"logprobs", 3}};
  json j = post(s, "/v1/completions", body).doc();
  const std::string text = j["choices"][0]["text"];
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  std::string from_tokens;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    from_tokens += lp["tokens"][i].get<std::string>();
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-5);
  }
  EXPECT_EQ(from_tokens, text);

  // A stop string made of the end of one token and the start of the next.
  const auto& tokens = lp["tokens"];
  size_t k = 0;
  while (k + 1 < tokens.size() && (tokens[k].get<std::string>().empty() || tokens[k + 1].get<std::string>().empty() ||
                                   k < 2))
    ++k;
  ASSERT_LT(k + 1, tokens.size()) << "not enough text to place a stop string";
  std::string prefix;
  for (size_t i = 0; i < k; ++i) prefix += tokens[i].get<std::string>();
  const std::string a = tokens[k], b = tokens[k + 1];
  const std::string stop = a.substr(a.size() - 1) + b.substr(0, 1);
  const std::string expected = (prefix + a).substr(0, (prefix + a + b).find(stop));
  body["stop"] = json::array({"\x01never", stop});
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    Reply r = post(s, "/v1/completions", body);
    ASSERT_EQ(r.status, 200);
    std::string got, finish;
    if (stream) {
      auto events = sse_payloads(r.body);
      for (size_t i = 0; i + 1 < events.size(); ++i) {
        json e = json::parse(events[i]);
        got += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
      }
    } else {
      got = r.doc()["choices"][0]["text"];
      finish = r.doc()["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(got, expected) << "stream=" << stream << " stop='" << stop << "'";
    EXPECT_EQ(finish, "stop");
  }

  // Chat logprobs: one entry per shown token, top alternatives sorted.
  json chat = chat_body("hi", 8);
  chat["logprobs"] = true;
  chat["top_logprobs"] = 2;
  json c = post(s, "/v1/chat/completions", chat).doc();
  const json& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_GE(content.size(), 1u);
  std::string joined;
  for (const json& e : content) {
    joined += e["token"].get<std::string>();
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
  }
  EXPECT_EQ(joined, c["choices"][0]["message"]["content"].get<std::string>());
}

TEST(ServeHttp, BadRequestsGetOpenAIErrorsAndTheServerKeepsServing) {
  ServeOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  struct Case {
    std::string path, body;
    int status;
    std::string code;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, "invalid_json"},
      {"/v1/chat/completions", R"({"messages":"hi"})", 400, ""},
      {"/v1/chat/completions", R"({"messages":[]})", 400, ""},
      {"/v1/chat/completions", R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})", 404,
       "model_not_found"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":9})", 400, ""},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":99})", 400, ""},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]})", 400,
       "images_not_supported"},
      {"/v1/completions", R"({"model":"tiny-b","prompt":[)" + [] {
         std::string ids;
         for (int i = 0; i < 600; ++i) ids += (i ? "," : "") + std::to_string(10 + i % 100);
         return ids;
       }() + "]}",
       400, "context_length_exceeded"},
      {"/v1/completions", R"({"prompt":[5000]})", 400, ""},
      {"/v1/completions", R"({"prompt":")" + std::string(5000, 'a') + "\"}", 413, "request_too_large"},
      {"/v1/nothing", "{}", 404, "unknown_url"},
  };
  for (const Case& c : cases) {
    Reply r = post(s, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 200) << " -> " << r.body;
    json e = r.doc();
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    EXPECT_TRUE(e["error"].contains("param"));
    if (!c.code.empty()) {
      EXPECT_EQ(e["error"]["code"], c.code) << r.body;
    }
  }
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("still here", 2)).status, 200);
  std::string metrics = get(s, "/metrics").body;
  EXPECT_EQ(metric(metrics, R"(reprise_requests_total{model="",endpoint="chat_completions",status="404"})"), 1);
  EXPECT_GE(metric(metrics, R"(reprise_requests_total{model="",endpoint="completions",status="413"})"), 1);
}

// --max-body-bytes bounds what a request can make the server hold, however
// the body is sent: chunked (no Content-Length) or gzip (a small compressed
// body that decompresses to far more). Within the limit both are served.
// A body sent to a path that takes none is refused before it is read.
TEST(ServeHttp, BodyLimitHoldsForChunkedAndCompressedBodies) {
  ServeOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  auto chunked = [](const std::string& path, const std::string& body) {
    std::string out = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    for (size_t i = 0; i < body.size(); i += 1000) {
      const std::string piece = body.substr(i, 1000);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      out += size + piece + "\r\n";
    }
    return out + "0\r\n\r\n";
  };
  const std::string big = R"({"max_tokens":1,"prompt":")" + std::string(60000, 'a') + "\"}";
  const std::string small = R"({"max_tokens":1,"prompt":"hello"})";
  {
    RawConnection c(s.port);
    c.send(chunked("/v1/completions", big));
    const std::string reply = c.read_until("}}");
    EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 200);
    EXPECT_NE(reply.find("request_too_large"), std::string::npos);
  }
  {
    RawConnection c(s.port);
    c.send(chunked("/v1/completions", small));
    const std::string reply = c.read_until("}}");
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 200);
  }
  {
    RawConnection c(s.port);
    c.send(chunked("/v1/nothing", big));
    const std::string reply = c.read_until("}}");
    EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply.substr(0, 200);
  }
  // Ambiguous framing, which a proxy in front might read differently: 400.
  for (const std::string headers : {"Content-Length: 33\r\nContent-Length: 5\r\n",
                                     "Content-Length: 33\r\nTransfer-Encoding: chunked\r\n",
                                     "Content-Length: 33x\r\n"}) {
    RawConnection c(s.port);
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + small);
    const std::string reply = c.read_until("}}");
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << headers << reply.substr(0, 200);
    EXPECT_NE(reply.find("bad_request_framing"), std::string::npos) << headers << reply.substr(0, 300);
  }
  httplib::Client gz = s.client();
  gz.set_compress(true);  // gzip request bodies
  const std::string bomb = R"({"max_tokens":1,"prompt":")" + std::string(2 << 20, 'a') + "\"}";
  auto r = gz.Post("/v1/completions", bomb, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413) << r->body.substr(0, 200);
  r = gz.Post("/v1/completions", small, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 200);
  EXPECT_EQ(get(s, "/health").status, 200);
}

// A second server on a port in use fails to start (cpp-httplib's default
// SO_REUSEPORT let it start and take half the connections).
TEST(ServeHttp, ASecondServerOnAPortInUseFailsToStart) {
  TestServer s;
  ServeOptions o;
  o.port = s.port;
  o.model_path = model_a_path();
  HttpServer second(o, *s.registry);
  EXPECT_THROW(second.bind(), Error);
  EXPECT_EQ(get(s, "/health").status, 200);
}

// logit_bias reaches the sampler: +100 on one token makes greedy decoding
// repeat it; a token outside the vocabulary is a 400 naming it. The
// penalties are accepted and change a sampled reply's course.
TEST(ServeHttp, LogitBiasAndPenaltiesReachTheSampler) {
  TestServer s;
  json forced = {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 1},
                 {"logit_bias", {{"300", 100}}}};
  Reply r = post(s, "/v1/completions", forced);
  ASSERT_EQ(r.status, 200) << r.body;
  const json tokens = r.doc()["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(tokens[1], tokens[2]);
  EXPECT_EQ(r.doc()["choices"][0]["text"], tokens[0].get<std::string>() + tokens[1].get<std::string>() +
                                                tokens[2].get<std::string>());
  // The response's id is its x-request-id too (the SDKs' request_id).
  auto raw = s.client().Post("/v1/completions", forced.dump(), "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->get_header_value("x-request-id"), json::parse(raw->body)["id"].get<std::string>());
  forced["logit_bias"] = {{"301", 100}};
  const json other = post(s, "/v1/completions", forced).doc()["choices"][0]["logprobs"]["tokens"];
  EXPECT_NE(other[0], tokens[0]);

  forced["logit_bias"] = {{"99999999", 1}};
  Reply outside = post(s, "/v1/completions", forced);
  EXPECT_EQ(outside.status, 400) << outside.body;
  EXPECT_EQ(outside.doc()["error"]["param"], "logit_bias.99999999");

  json plain = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  json penalised = plain;
  penalised["frequency_penalty"] = 2;
  penalised["presence_penalty"] = 2;
  Reply a = post(s, "/v1/completions", plain), b = post(s, "/v1/completions", penalised);
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_NE(a.doc()["choices"][0]["text"], b.doc()["choices"][0]["text"]);
}

// --cors-origin lets an allowed page call the API from a browser: its
// preflight is answered (before the API key is asked for) and its requests
// get its origin back; other origins get no CORS headers.
TEST(ServeHttp, CorsForAllowedOrigins) {
  ServeOptions o;
  o.cors_origins = {"http://ui.example"};
  o.api_key = "k";
  TestServer s(o);
  httplib::Client c = s.client();
  auto preflight = c.Options("/v1/chat/completions", {{"Origin", "http://ui.example"},
                                                      {"Access-Control-Request-Method", "POST"},
                                                      {"Access-Control-Request-Headers", "authorization,content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  // The headers a page's SDK asks to send (Anthropic's x-api-key, ...) are allowed too.
  auto sdk_preflight = c.Options("/v1/messages", {{"Origin", "http://ui.example"},
                                                  {"Access-Control-Request-Method", "POST"},
                                                  {"Access-Control-Request-Headers", "x-api-key,anthropic-version"}});
  ASSERT_TRUE(sdk_preflight);
  EXPECT_NE(sdk_preflight->get_header_value("Access-Control-Allow-Headers").find("x-api-key"), std::string::npos);
  auto models = c.Get("/v1/models", {{"Origin", "http://ui.example"}, {"Authorization", "Bearer k"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(models->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  auto other = c.Get("/v1/models", {{"Origin", "http://evil.example"}, {"Authorization", "Bearer k"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto other_preflight = c.Options("/v1/chat/completions", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other_preflight);
  EXPECT_EQ(other_preflight->status, 404);
}

TEST(ServeHttp, ApiKey) {
  ServeOptions o;
  o.api_key = "sekret";
  TestServer s(o);
  Reply missing = post(s, "/v1/chat/completions", chat_body("x", 2));
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.doc()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("x", 2), {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(get(s, "/v1/models", {{"Authorization", "Bearer sekre"}}).status, 401);
  EXPECT_EQ(get(s, "/metrics").status, 401);
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("x", 2), {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(get(s, "/health").status, 200);  // liveness probes need no key
}

TEST(ServeHttp, ConcurrentClientsGetTheirOwnResults) {
  ServeOptions o;
  o.parallel = 3;
  TestServer s(o);
  const int n_clients = 8;
  // Reference answers, one request at a time.
  std::vector<std::string> expected(n_clients);
  // Each request's short prompt is one prefill batch, and each completion
  // token but the first a decode step: one sequence batch per completion token.
  int64_t sequence_batches = 0;
  for (int i = 0; i < n_clients; ++i) {
    json r = post(s, "/v1/chat/completions", chat_body("question " + std::to_string(i % 4), 12)).doc();
    expected[i] = r["choices"][0]["message"]["content"];
    sequence_batches += r["usage"]["completion_tokens"].get<int64_t>();
  }
  std::vector<std::string> got(n_clients);
  std::vector<int> status(n_clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < n_clients; ++i) {
    threads.emplace_back([&, i] {
      json body = chat_body("question " + std::to_string(i % 4), 12);
      body["stream"] = (i % 2) == 0;
      Reply r = post(s, "/v1/chat/completions", body);
      status[i] = r.status;
      if (i % 2 == 0) {
        for (const std::string& e : sse_payloads(r.body)) {
          if (e == "[DONE]") continue;
          json c = json::parse(e);
          if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
            got[i] += c["choices"][0]["delta"]["content"].get<std::string>();
        }
      } else {
        got[i] = r.doc()["choices"][0]["message"]["content"];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n_clients; ++i) {
    EXPECT_EQ(status[i], 200);
    EXPECT_EQ(got[i], expected[i]) << "client " << i;
  }
  std::string metrics = get(s, "/metrics").body;
  EXPECT_EQ(metric(metrics, R"(reprise_requests_total{model="tiny-a",endpoint="chat_completions",status="200"})"),
            2 * n_clients);
  EXPECT_EQ(metric(metrics, "reprise_sequence_slots"), 3);
  EXPECT_EQ(metric(metrics, "reprise_queue_depth"), 0);
  // Concurrent requests' batches may share passes (continuous batching);
  // every batch is counted once, in both phases.
  const double passes = metric(metrics, R"(reprise_forward_passes_total{model="tiny-a"})");
  const double batches = metric(metrics, R"(reprise_forward_pass_sequences_total{model="tiny-a"})");
  EXPECT_EQ(batches, 2 * sequence_batches);
  EXPECT_GT(passes, 0);
  EXPECT_LE(passes, batches);
  EXPECT_LE(metric(metrics, R"(reprise_forward_pass_sequences_max{model="tiny-a"})"), 3);
}

TEST(ServeHttp, StalledClientsBlockNobody) {
  ServeOptions o;
  o.parallel = 1;
  o.read_timeout_seconds = 30;
  o.write_timeout_seconds = 30;
  TestServer s(o);
  // One client sends half a request and stops; another starts a stream far
  // bigger than the socket buffers (~1 MB with logprobs on every token) and
  // never reads it.
  RawConnection half(s.port);
  half.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"messa");
  RawConnection never_reads(s.port);
  json big_stream = {{"prompt", "Once"}, {"max_tokens", 800}, {"temperature", 0},
                     {"stream", true},   {"logprobs", 5},     {"ignore_eos", true}};
  never_reads.send_post("/v1/completions", big_stream.dump());
  std::this_thread::sleep_for(50ms);

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(get(s, "/metrics").status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  // With one sequence slot, another generation still gets through long
  // before the 30 s write timeout: the unread stream's output is buffered in
  // the server, so its slot is free as soon as its tokens are generated.
  Reply r = post(s, "/v1/chat/completions", chat_body("are you there", 4));
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(ServeHttp, RefusesGenerationsBeyondItsConnectionThreadsButStaysHealthy) {
  ServeOptions o;
  o.parallel = 1;
  o.http_threads = 10;  // 8 kept for other requests: 2 generations may wait or run
  TestServer s(o);
  std::vector<std::unique_ptr<RawConnection>> streams;
  for (int i = 0; i < 2; ++i) {
    streams.push_back(std::make_unique<RawConnection>(s.port));
    streams.back()->send_post(
        "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 3000}, {"stream", true}, {"ignore_eos", true}}.dump());
    // The first one occupies the only slot; the second waits behind it.
    if (i == 0) {
      ASSERT_NE(streams[0]->read_until("data: ").find("data: "), std::string::npos);
    }
  }
  std::this_thread::sleep_for(50ms);
  Reply busy = post(s, "/v1/chat/completions", chat_body("one more", 2));
  EXPECT_EQ(busy.status, 503) << busy.body;
  EXPECT_EQ(busy.doc()["error"]["code"], "server_busy");
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(metric(get(s, "/metrics").body, "reprise_queue_depth"), 1);
  streams.clear();  // hang up: both generations are cancelled
  const auto t0 = std::chrono::steady_clock::now();
  Reply after;
  while ((after = post(s, "/v1/chat/completions", chat_body("one more", 2))).status != 200 &&
         std::chrono::steady_clock::now() - t0 < 5s)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(after.status, 200);
}

// A queued request whose client hangs up leaves the queue at once, not when
// a slot frees: it no longer holds a queue place, a connection thread and
// its model while the request ahead of it runs on.
TEST(ServeHttp, QueuedRequestsWhoseClientsHangUpLeaveTheQueueAtOnce) {
  ServeOptions o;
  o.parallel = 1;
  TestServer s(o);
  RawConnection running(s.port);
  running.send_post("/v1/completions",
                    json{{"prompt", "Once"}, {"max_tokens", 100000}, {"stream", true}, {"ignore_eos", true}}.dump());
  ASSERT_NE(running.read_until("data: ").find("data: "), std::string::npos);
  auto queue_depth = [&] { return metric(get(s, "/metrics").body, "reprise_queue_depth"); };
  {
    std::vector<std::unique_ptr<RawConnection>> queued;
    for (int i = 0; i < 3; ++i) {
      queued.push_back(std::make_unique<RawConnection>(s.port));
      queued.back()->send_post("/v1/completions",
                               json{{"prompt", "Hello " + std::to_string(i)}, {"max_tokens", 4}, {"stream", i == 1}}.dump());
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (queue_depth() != 3 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(queue_depth(), 3);
  }  // hang up the three
  const auto t0 = std::chrono::steady_clock::now();
  while (queue_depth() != 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(queue_depth(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // The first request is still generating all the while.
  EXPECT_EQ(metric(get(s, "/metrics").body, "reprise_sequences_active"), 1);
  EXPECT_NE(running.read_some(), "");
  running.close();
}

// Shutting down (SIGTERM) ends a stream with an error event and [DONE], and
// answers a queued request 503: both retryable, neither cut off mid-reply
// nor blamed on the client (499).
TEST(ServeHttp, ShutdownEndsStreamsAndQueuedRequestsWithARetryableError) {
  ServeOptions o;
  o.parallel = 1;
  TestServer s(o);
  RawConnection streaming(s.port), queued(s.port);
  streaming.send_post("/v1/completions",
                      json{{"prompt", "Once"}, {"max_tokens", 100000}, {"stream", true}, {"ignore_eos", true}}.dump());
  ASSERT_NE(streaming.read_until("data: ").find("data: "), std::string::npos);
  queued.send_post("/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 4}}.dump());
  const auto t0 = std::chrono::steady_clock::now();
  while (metric(get(s, "/metrics").body, "reprise_queue_depth") != 1 && std::chrono::steady_clock::now() - t0 < 5s)
    std::this_thread::sleep_for(10ms);
  s.server->stop();
  const std::string rest = streaming.read_until("[DONE]");
  EXPECT_NE(rest.find("server_shutting_down"), std::string::npos) << rest.substr(rest.size() > 400 ? rest.size() - 400 : 0);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
  // ... and the chunked body ends properly (its last, empty chunk), so HTTP
  // clients read the event instead of reporting a truncated response.
  std::string ending = rest;
  while (ending.find("\r\n0\r\n\r\n") == std::string::npos) {
    const std::string more = streaming.read_some();
    if (more.empty()) break;
    ending += more;
  }
  EXPECT_NE(ending.find("\r\n0\r\n\r\n"), std::string::npos) << ending.substr(ending.size() > 200 ? ending.size() - 200 : 0);
  const std::string reply = queued.read_until("}}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  EXPECT_NE(reply.find("server_shutting_down"), std::string::npos) << reply;
}

TEST(ServeHttp, DisconnectCancelsTheGenerationAndFreesItsState) {
  TestServer s;
  auto cancelled_count = [&] {
    return metric(get(s, "/metrics").body, R"(reprise_cancelled_requests_total{model="tiny-a"})");
  };
  for (bool stream : {true, false}) {
    const double before = std::max(0.0, cancelled_count());
    {
      RawConnection c(s.port);
      json body = {{"prompt", "Once upon a time"}, {"max_tokens", 4000}, {"stream", stream}, {"ignore_eos", true}};
      c.send_post("/v1/completions", body.dump());
      if (stream) {
        std::string got = c.read_until("data: ");
        ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
      } else {
        std::this_thread::sleep_for(100ms);  // generation under way, nothing written yet
      }
    }  // hang up
    const auto t0 = std::chrono::steady_clock::now();
    while (cancelled_count() < before + 1 && std::chrono::steady_clock::now() - t0 < 3s)
      std::this_thread::sleep_for(10ms);
    EXPECT_EQ(cancelled_count(), before + 1) << "stream=" << stream;
    // Cancelled well before the 4000 tokens, and no sequence holds blocks.
    json stats = get(s, "/v1/cache/stats").doc();
    EXPECT_EQ(stats["models"][0]["cache"]["blocks_in_use"], 0) << stats.dump();
    EXPECT_EQ(stats["models"][0]["in_flight"], 0);
  }
  // The slot counts itself free just after the handler has recorded the
  // cancellation, so the gauge may lag the counter briefly.
  std::string metrics = get(s, "/metrics").body;
  const auto t0 = std::chrono::steady_clock::now();
  while (metric(metrics, "reprise_sequences_active") != 0 && std::chrono::steady_clock::now() - t0 < 3s) {
    std::this_thread::sleep_for(10ms);
    metrics = get(s, "/metrics").body;
  }
  EXPECT_LT(metric(metrics, R"(reprise_completion_tokens_total{model="tiny-a"})"), 3000);
  EXPECT_EQ(metric(metrics, "reprise_sequences_active"), 0);
}

TEST(ServeHttp, TwoModelsHaveSeparateCachesAndSaltsIsolateTenants) {
  TestServer s;
  json a = chat_body("A shared question about the weather today", 4);
  json first = post(s, "/v1/chat/completions", a).doc();
  json again = post(s, "/v1/chat/completions", a).doc();
  const int prompt_tokens = first["usage"]["prompt_tokens"];
  EXPECT_EQ(first["model"], "tiny-a");
  EXPECT_GE(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), prompt_tokens - 1);

  json b = a;
  b["model"] = "tiny-b";
  json on_b = post(s, "/v1/chat/completions", b).doc();
  EXPECT_EQ(on_b["model"], "tiny-b");
  EXPECT_EQ(on_b["usage"]["prompt_tokens"], prompt_tokens);  // same tokenizer
  EXPECT_EQ(on_b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // nothing from tiny-a's cache
  EXPECT_NE(on_b["system_fingerprint"], first["system_fingerprint"]);

  json salted = a;
  salted["cache_salt"] = "tenant-2";
  json s1 = post(s, "/v1/chat/completions", salted).doc();
  EXPECT_EQ(s1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json s2 = post(s, "/v1/chat/completions", salted).doc();
  EXPECT_GE(s2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), prompt_tokens - 1);

  json stats = get(s, "/v1/cache/stats").doc();
  EXPECT_TRUE(stats["models"][0]["loaded"]);
  EXPECT_TRUE(stats["models"][1]["loaded"]);
  EXPECT_EQ(stats["models"][1]["cache"]["lookups"], 1);
  EXPECT_NE(stats["models"][0]["fingerprint"], stats["models"][1]["fingerprint"]);
}

TEST(ServeHttp, OneCacheBudgetAcrossModelsEvictsTheOldestConversation) {
  json a = chat_body("Question one about the weather today and tomorrow, at some length so it fills blocks", 4);
  double one_conversation = 0;  // cache bytes a conversation like these leaves behind
  {
    TestServer probe;
    ASSERT_EQ(post(probe, "/v1/chat/completions", a).status, 200);
    one_conversation = metric(get(probe, "/metrics").body, R"(reprise_cache_bytes{model="tiny-a"})");
    ASSERT_GT(one_conversation, 0);
  }
  ServeOptions o;
  o.cache_total_ram_mib = 4 * one_conversation / (1024 * 1024);  // both models together hold ~4
  TestServer s(o);
  const double limit = static_cast<double>(static_cast<uint64_t>(o.cache_total_ram_mib * 1024 * 1024));
  json first = post(s, "/v1/chat/completions", a).doc();
  ASSERT_TRUE(first.contains("usage")) << first.dump();
  EXPECT_GE(post(s, "/v1/chat/completions", a).doc()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            first["usage"]["prompt_tokens"].get<int>() - 1);
  const std::string metrics0 = get(s, "/metrics").body;
  EXPECT_EQ(metric(metrics0, "reprise_cache_shared_budget_bytes"), limit);
  // Many other conversations on the second model push tiny-a's out.
  for (int i = 0; i < 40; ++i) {
    json b = chat_body("Conversation " + std::to_string(i) + " on the other model with enough words to fill a block",
                       4);
    b["model"] = "tiny-b";
    ASSERT_EQ(post(s, "/v1/chat/completions", b).status, 200);
  }
  const std::string metrics = get(s, "/metrics").body;
  EXPECT_LE(metric(metrics, "reprise_cache_shared_bytes"), limit);
  EXPECT_GT(metric(metrics, "reprise_cache_shared_evictions_total"), 0);
  EXPECT_GT(metric(metrics, R"(reprise_cache_evictions_total{model="tiny-a"})"), 0)
      << "the other model's newer conversations must take the budget from the oldest one";
  json again = post(s, "/v1/chat/completions", a).doc();
  EXPECT_LT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            first["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
}

TEST(ServeHttp, RepeatedMultiTurnChatReusesTheConversationSoFar) {
  TestServer s;
  json body = chat_body("Let us talk about caches.", 12);
  json turn1 = post(s, "/v1/chat/completions", body).doc();
  ASSERT_TRUE(turn1.contains("choices")) << turn1.dump();
  const std::string reply = turn1["choices"][0]["message"]["content"];
  body["messages"].push_back({{"role", "assistant"}, {"content", reply}});
  body["messages"].push_back({{"role", "user"}, {"content", "Tell me more."}});
  json turn2 = post(s, "/v1/chat/completions", body).doc();
  const int turn1_prompt = turn1["usage"]["prompt_tokens"];
  const int cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 0);
  // The whole first prompt (and usually part of the reply) is reused.
  EXPECT_GE(cached, turn1_prompt - 1);
  EXPECT_GT(turn2["usage"]["prompt_tokens"].get<int>(), cached);
}

TEST(ServeHttp, ModelsLoadOnDemandAndUnloadLeastRecentlyUsed) {
  const uint64_t file_bytes = std::filesystem::file_size(model_a_path());
  ServeOptions o;
  o.cache_ram_mib = 1;
  // Room for one model (file + 1 MiB cache) but not two.
  o.models_max_ram_mib = (1.5 * file_bytes) / 1048576.0 + 1.5;
  o.model_specs = {"tiny-a=" + model_a_path(), "tiny-b=" + model_b_path()};
  std::vector<ModelSource> sources = {{"tiny-a", model_a_path()}, {"tiny-b", model_b_path()}};
  TestServer s(o, sources);
  auto loaded = [&] {
    std::vector<bool> out;
    const json models = get(s, "/v1/models").doc();
    for (const json& m : models["data"]) out.push_back(m["loaded"]);
    return out;
  };
  EXPECT_EQ(loaded(), (std::vector<bool>{false, false}));  // nothing loads before it is asked for
  json a = chat_body("hi", 2);
  EXPECT_EQ(post(s, "/v1/chat/completions", a).status, 200);
  EXPECT_EQ(loaded(), (std::vector<bool>{true, false}));
  const double one_model_weights = metric(get(s, "/metrics").body, "reprise_weight_memory_bytes");
  EXPECT_GT(one_model_weights, 0);
  json b = a;
  b["model"] = "tiny-b";
  EXPECT_EQ(post(s, "/v1/chat/completions", b).status, 200);
  EXPECT_EQ(loaded(), (std::vector<bool>{false, true}));

  // A model with a request in flight is never unloaded: while a long stream
  // runs on tiny-b, loading tiny-a is refused (503), not done by force.
  RawConnection busy(s.port);
  // (The stream is long enough to outlast any machine's speed; it ends when
  // the client hangs up.)
  busy.send_post("/v1/completions", json{{"model", "tiny-b"},
                                         {"prompt", "Once"},
                                         {"max_tokens", 100000},
                                         {"stream", true},
                                         {"ignore_eos", true}}
                                        .dump());
  ASSERT_NE(busy.read_until("data: ").find("data: "), std::string::npos);
  Reply refused = post(s, "/v1/chat/completions", a);
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.doc()["error"]["code"], "model_capacity");
  busy.close();
  const auto t0 = std::chrono::steady_clock::now();
  auto b_in_flight = [&] {
    for (const json& m : get(s, "/v1/cache/stats").doc()["models"])
      if (m["id"] == "tiny-b") return m["in_flight"].get<int64_t>();
    return int64_t{-1};
  };
  while (b_in_flight() != 0 && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(post(s, "/v1/chat/completions", a).status, 200);
  EXPECT_EQ(loaded(), (std::vector<bool>{true, false}));
  std::string metrics = get(s, "/metrics").body;
  EXPECT_EQ(metric(metrics, R"(reprise_model_unloads_total{model="tiny-a"})"), 1);
  EXPECT_EQ(metric(metrics, R"(reprise_model_unloads_total{model="tiny-b"})"), 1);
  EXPECT_EQ(metric(metrics, R"(reprise_model_loads_total{model="tiny-a"})"), 2);
  // Unloaded models returned their weights' memory: one model's worth is mapped.
  EXPECT_EQ(metric(metrics, "reprise_weight_memory_bytes"), one_model_weights);
  // Cache counters survive the unload.
  EXPECT_GE(metric(metrics, R"(reprise_cache_lookups_total{model="tiny-a"})"), 2);
}

TEST(ServeHttp, ChatTemplateFileOverridesAndTemplateErrorsAreReported) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("reprise-server-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "strict.jinja")
        << "{% for m in messages %}{% if 'forbidden' in m['content'] %}{{ raise_exception('no forbidden words here') }}"
           "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]";
    std::ofstream(dir / "broken.jinja") << "{% for m in messages %}{{ m['content'] }";
    // Parses, but fails while rendering any conversation: the template's fault.
    std::ofstream(dir / "fails.jinja") << "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ no_such_function() }}";
    // Renders plain conversations, but reads a field OpenAI makes optional
    // (a tool's description), as gpt-oss's template does: Jinja2 fails on
    // such a request too, and the request is what is wrong with it.
    std::ofstream(dir / "tools.jinja") << "{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                          "{% for t in tools or [] %}{{ t['function']['description'].strip() }}{% endfor %}";
  }
  {
    ServeOptions o;
    o.chat_template_file = (dir / "tools.jinja").string();
    TestServer s(o);
    json plain = chat_body("x", 2);
    EXPECT_EQ(post(s, "/v1/chat/completions", plain).status, 200);
    json described = plain, bare = plain;
    described["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"description", " d "}}}}});
    bare["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    EXPECT_EQ(post(s, "/v1/chat/completions", described).status, 200);
    Reply refused = post(s, "/v1/chat/completions", bare);
    EXPECT_EQ(refused.status, 400) << refused.body;
    EXPECT_EQ(refused.doc()["error"]["code"], "chat_template_error");
    EXPECT_NE(refused.doc()["error"]["message"].get<std::string>().find("cannot render this request"),
              std::string::npos)
        << refused.body;
  }
  {
    ServeOptions o;
    o.chat_template_file = (dir / "strict.jinja").string();
    TestServer s(o);
    json ok = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 2}};
    EXPECT_EQ(post(s, "/v1/chat/completions", ok).status, 200);
    Reply raised = post(s, "/v1/chat/completions", chat_body("a forbidden request", 2));
    ASSERT_EQ(raised.status, 400) << raised.body;
    EXPECT_NE(raised.doc()["error"]["message"].get<std::string>().find("no forbidden words here"), std::string::npos);
    EXPECT_EQ(get(s, "/v1/cache/stats").doc()["models"][0]["chat_template"], "file");
  }
  {
    ServeOptions o;
    o.chat_template_file = (dir / "broken.jinja").string();
    TestServer s(o);
    Reply broken = post(s, "/v1/chat/completions", chat_body("x", 2));
    EXPECT_EQ(broken.status, 500);
    EXPECT_EQ(broken.doc()["error"]["code"], "chat_template_error");
    // Completions do not need the template.
    EXPECT_EQ(post(s, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  }
  {
    ServeOptions o;
    o.chat_template_file = (dir / "fails.jinja").string();
    TestServer s(o);
    Reply failed = post(s, "/v1/chat/completions", chat_body("x", 2));
    EXPECT_EQ(failed.status, 500) << failed.body;
    EXPECT_EQ(failed.doc()["error"]["code"], "chat_template_error");
    EXPECT_NE(failed.doc()["error"]["message"].get<std::string>().find("template render error"), std::string::npos)
        << failed.body;
  }
  fs::remove_all(dir);
}

TEST(ServeHttp, ResolvesModelSourcesFromOptions) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("reprise-models-dir-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "beta.gguf") << "x";
  std::ofstream(dir / "alpha.gguf") << "x";
  std::ofstream(dir / "mmproj-alpha.gguf") << "x";
  std::ofstream(dir / "notes.txt") << "x";
  ServeOptions o;
  o.model_path = "/m/main.gguf";
  o.model_specs = {"x=/m/other.gguf", "/m/plain.gguf"};
  o.models_dir = dir.string();
  std::vector<ModelSource> s = resolve_model_sources(o);
  std::vector<std::string> ids;
  for (const auto& m : s) ids.push_back(m.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"main", "x", "plain", "alpha", "beta"}));
  o.model_specs = {"=bad"};
  EXPECT_THROW(resolve_model_sources(o), reprise::Error);
  o.model_specs = {"main=/elsewhere.gguf"};
  EXPECT_THROW(resolve_model_sources(o), reprise::Error);
  fs::remove_all(dir);
  ServeOptions none;
  EXPECT_FALSE(none.validate().empty());
  ServeOptions batch;
  batch.model_path = "/m/main.gguf";
  EXPECT_EQ(batch.validate(), "");
  batch.decode_batch = 0;
  EXPECT_NE(batch.validate().find("--decode-batch"), std::string::npos);
  batch.decode_batch = 1;
  EXPECT_EQ(batch.validate(), "");
  EXPECT_EQ(make_registry_options(batch).max_decode_batch, 1);
  batch.prefill_chunk_decoding = 0;
  EXPECT_NE(batch.validate().find("--prefill-chunk-decoding"), std::string::npos);
  batch.prefill_chunk_decoding = 64;
  EXPECT_EQ(make_registry_options(batch).prefill_chunk_decoding, 64);
}

}  // namespace

// Which of the fixture templates print tool-call arguments with `| tojson`
// (they want objects), checked against their sources: Qwen2.5's, Llama
// 3.1's, gpt-oss's and DeepSeek-R1-Distill's do; Qwen3's and Nemotron's test
// `is string` first; the others print no tool calls.
TEST(PromptBuilder, FixtureTemplatesThatWantObjectArguments) {
  REPRISE_REQUIRE_SHARED(fixtures);
  const std::set<std::string> want_objects = {"Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                              "openai-gpt-oss-120b.jinja",
                                              "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"};
  int templates = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures + "/templates")) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    std::ifstream in(entry.path());
    std::stringstream source;
    source << in.rdbuf();
    const ModelChatTemplate t = template_from(source.str());
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(t.renders_plain_chat) << name;
    EXPECT_EQ(t.wants_object_arguments, want_objects.count(name) == 1) << name;
  }
  EXPECT_GE(templates, 10);
}
