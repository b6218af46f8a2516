// A reprise HTTP server on an ephemeral port for tests, with helpers to
// call it, and the scripted-reply requests that make a synthetic model
// write exact text (tool calls, reasoning) through the API.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model_fixtures.h"
#include "server/http_server.h"
#include "server/model_registry.h"
#include "server/serve_options.h"

namespace reprise::test {

using json = nlohmann::json;

struct Server {
  explicit Server(ServeOptions options) {
    options.port = 0;
    options.log_requests = false;
    RegistryOptions ro = make_registry_options(options);
    ro.threads = 1;
    registry = std::make_unique<ModelRegistry>(resolve_model_sources(options), ro);
    server = std::make_unique<HttpServer>(options, *registry);
    port = server->bind();
    thread = std::thread([this] { server->serve(); });
    for (int i = 0; i < 500; ++i) {
      httplib::Client c("127.0.0.1", port);
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "server did not come up";
  }
  ~Server() {
    server->stop();
    thread.join();
  }
  std::pair<int, json> post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // A streamed chat completion, put back together: its reasoning, content,
  // tool-call deltas and finish_reason.
  struct Streamed {
    std::string reasoning, content, finish;
    std::vector<json> calls;
  };
  Streamed stream_chat(const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    Streamed out;
    std::istringstream lines(r ? r->body : "");
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const json chunk = json::parse(line.substr(6));
      for (const auto& ch : chunk["choices"]) {
        const json& d = ch["delta"];
        if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content") && d["content"].is_string()) out.content += d["content"].get<std::string>();
        if (d.contains("tool_calls")) out.calls.push_back(d["tool_calls"][0]);
        if (!ch["finish_reason"].is_null()) out.finish = ch["finish_reason"];
      }
    }
    return out;
  }
  // The value of a Prometheus sample line starting with `prefix`.
  double metric(const std::string& prefix) const {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/metrics");
    std::istringstream in(r ? r->body : "");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(line.find_last_of(' ') + 1));
    return -1;
  }

  std::unique_ptr<ModelRegistry> registry;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = -1;
};

inline const json kWeatherTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");

// A chat request that makes a synthetic model write exactly the text of
// its added tokens: logit_bias puts them first (the repetition penalty
// holds a token back once written, so the next most biased comes next),
// and the "@@" their text ends with is a stop string.
inline json scripted_reply_request(const std::string& question, const std::vector<std::pair<int32_t, double>>& bias,
                            bool stream = false) {
  json b = json::object();
  for (auto [id, v] : bias) b[std::to_string(id)] = v;
  return json{{"messages", {{{"role", "user"}, {"content", question}}}},
              {"max_tokens", 4},
              {"temperature", 0},
              {"logit_bias", b},
              {"repeat_penalty", 10},
              {"stop", json::array({"@@"})},
              {"stream", stream}};
}

// Serving the synthetic model `spec` (made once under `tag`) with the chat
// template `source`.
inline ServeOptions serve_with_template(const std::string& tag, const SyntheticModelSpec& spec, const std::string& source) {
  const std::string file = ::testing::TempDir() + "/" + tag + ".jinja";
  std::ofstream(file) << source;
  ServeOptions options;
  options.model_path = test::synthetic_model(tag, spec).path;
  options.chat_template_file = file;
  return options;
}

}  // namespace reprise::test
