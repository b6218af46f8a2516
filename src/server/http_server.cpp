#include "server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "server/choice_stream.h"
#include "server/disconnect_monitor.h"
#include "server/embeddings.h"
#include "server/generation.h"
#include "server/harmony_parser.h"
#include "server/messages_output.h"
#include "server/messages_request.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/prompt_builder.h"
#include "server/reasoning_splitter.h"
#include "server/response_context.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/responses_request.h"
#include "server/scheduler.h"
#include "server/tool_call_parser.h"
#include "util/error.h"

namespace reprise {

namespace {

using ordered_json = nlohmann::ordered_json;
using std::chrono::milliseconds;

const char* endpoint_name(Endpoint e) {
  switch (e) {
    case Endpoint::Chat: return "chat_completions";
    case Endpoint::Completions: return "completions";
    case Endpoint::Responses: return "responses";
    case Endpoint::Embeddings: return "embeddings";
    case Endpoint::Messages: return "messages";
  }
  return "other";
}

// Bounded label set for metrics, whatever paths clients request.
const char* endpoint_label(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/chat/completions") return "chat_completions";
  if (path == "/v1/completions" || path == "/completions") return "completions";
  if (path.rfind("/v1/models", 0) == 0 || path == "/models") return "models";
  if (path == "/health" || path == "/v1/health") return "health";
  if (path == "/metrics") return "metrics";
  if (path == "/v1/cache/stats") return "cache_stats";
  if (path == "/tokenize") return "tokenize";
  if (path == "/detokenize") return "detokenize";
  if (path == "/apply-template") return "apply_template";
  if (path == "/v1/embeddings" || path == "/embeddings") return "embeddings";
  if (path == "/v1/messages" || path == "/v1/messages/count_tokens") return "messages";
  if (path == "/v1/responses" || path == "/responses" || path.rfind("/v1/responses/", 0) == 0 ||
      path.rfind("/responses/", 0) == 0)
    return "responses";
  return "other";
}

// logit_bias names tokens of the model's vocabulary (OpenAI refuses others).
std::optional<ApiError> check_logit_bias(const GenerationOptions& o, int64_t n_vocab) {
  for (const auto& [id, bias] : o.sampling.logit_bias)
    if (id >= n_vocab)
      return ApiError::invalid("logit_bias names token " + std::to_string(id) + ", outside the model's vocabulary of " +
                                   std::to_string(n_vocab),
                               "logit_bias." + std::to_string(id));
  return std::nullopt;
}

// A request whose body length is ambiguous: several Content-Length headers,
// one that is not a decimal number, or one beside Transfer-Encoding. A proxy
// in front may frame such a request differently (request smuggling), and
// cpp-httplib reads a malformed length as an empty body.
bool ambiguous_length(const httplib::Request& req) {
  const size_t lengths = req.get_header_value_count("Content-Length");
  if (lengths == 0) return false;
  if (lengths > 1 || req.has_header("Transfer-Encoding")) return true;
  const std::string v = req.get_header_value("Content-Length");
  return v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos;
}

// /v1/responses/{id}: a stored response (GET, DELETE).
bool is_response_path(const std::string& path) {
  for (const std::string_view prefix : {"/v1/responses/", "/responses/"})
    if (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
        path.find('/', prefix.size()) == std::string::npos)
      return true;
  return false;
}

// The routes that take a request body: POST ones, and DELETE of a stored
// response (which the pre-routing check lets through only without a body).
bool takes_body(const httplib::Request& req) {
  return (req.method == "POST" && (req.path == "/v1/chat/completions" || req.path == "/chat/completions" ||
                                  req.path == "/v1/completions" || req.path == "/completions" ||
                                  req.path == "/tokenize" || req.path == "/detokenize" ||
                                  req.path == "/apply-template" || req.path == "/v1/responses" ||
                                  req.path == "/responses" || req.path == "/v1/embeddings" ||
                                  req.path == "/embeddings" || req.path == "/v1/messages" ||
                                  req.path == "/v1/messages/count_tokens" ||
                                  req.path == "/lora-adapters" || req.path == "/v1/load_lora_adapter" ||
                                  req.path == "/v1/unload_lora_adapter")) ||
         (req.method == "DELETE" && is_response_path(req.path));
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// Constant-time for equal lengths, so the key cannot be found byte by byte
// from response timings.
bool same_secret(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

void reply_json(httplib::Response& res, int status, const ordered_json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

// An error in the shape the endpoint's API uses: Anthropic's for the
// Messages API, OpenAI's for every other.
ordered_json error_body(const ApiError& error, const char* endpoint) {
  return std::string_view(endpoint) == endpoint_name(Endpoint::Messages) ? anthropic_error_json(error)
                                                                         : error_json(error);
}

// A page of a list (OpenAI's and Anthropic's shape): its items, the ids of
// its first and last, and whether more follow.
ordered_json list_page(ordered_json data, bool more) {
  const ordered_json first = data.empty() ? ordered_json(nullptr) : data.front()["id"];
  const ordered_json last = data.empty() ? ordered_json(nullptr) : data.back()["id"];
  return {{"object", "list"}, {"data", std::move(data)}, {"first_id", first}, {"last_id", last}, {"has_more", more}};
}

class InFlight {
 public:
  explicit InFlight(std::atomic<int>& counter) : counter_(counter) { ++counter_; }
  ~InFlight() { --counter_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int>& counter_;
};

// The markers of a syntax the reply is read back by, those the vocabulary
// holds as control tokens (not shown by default): shown as their text.
void show_markers(const Tokenizer& tok, const std::vector<std::string>& markers, GenerationPlan& plan) {
  for (const std::string& marker : markers)
    if (auto id = tok.find_token(marker); id && tok.is_control(*id)) plan.visible_control_tokens.push_back(*id);
}

// Chat replies of a model whose template knows <think> are split into
// reasoning and content, unless the request asks for them raw
// (reasoning_format "none") or constrains the reply (structured output and
// forced tool calls write no reasoning).
void expect_reasoning(const ChatCompletionRequest& chat, const LoadedModel& model, ResponseContext& ctx,
                      GenerationPlan& plan) {
  const bool free_reply = !chat.options.raw_reasoning && !chat.options.json_schema;
  if (model.chat.harmony && free_reply) {
    // Its markers are control tokens: shown, so the channels can be read.
    ctx.harmony = true;
    ctx.harmony_calls = chat.tools.is_array() && !chat.tools.empty() && !chat.tool_choice_none;
    show_markers(*model.bundle->tokenizer, HarmonyStream::markers(), plan);
    return;
  }
  ctx.split_reasoning = model.chat.reasoning_tags && free_reply;
  ctx.opens_reasoning = plan.opens_reasoning;
}

// One of a request's choices (n): its generation's channel, and its job's
// Scheduler ticket.
struct ChoiceRun {
  std::shared_ptr<GenerationChannel> channel;
  uint64_t job = 0;
};

// The usage a request reports for its choices, `n` per prompt in prompt
// order: each prompt once, the completions summed, and as cached each
// prompt's tokens that came from the cache before this request (the least
// of its choices': the one that computed the prompt; the others read it
// back from the cache).
UsageCounts request_usage(std::span<const GenerationOutcome> outcomes, size_t n) {
  UsageCounts usage;
  for (size_t first = 0; first < outcomes.size(); first += n) {
    const std::span<const GenerationOutcome> prompt = outcomes.subspan(first, std::min(n, outcomes.size() - first));
    usage.prompt_tokens += prompt.front().usage.prompt_tokens;
    int64_t cached = prompt.front().usage.cached_tokens;
    for (const GenerationOutcome& o : prompt) {
      cached = std::min(cached, o.usage.cached_tokens);
      usage.completion_tokens += o.usage.completion_tokens;
    }
    usage.cached_tokens += cached;
  }
  return usage;
}

// Tool calls are read back when the request has tools, leaves the reply
// free and allows calls, and the template shows the model a syntax; marker
// tokens the vocabulary holds as control tokens are shown as text.
void expect_tool_calls(const ChatCompletionRequest& chat, const LoadedModel& model, ResponseContext& ctx,
                       GenerationPlan& plan) {
  const ToolCallSyntax syntax = model.chat.tool_call_syntax;
  ctx.id_syntax = syntax;
  if (!chat.parallel_tool_calls) ctx.max_tool_calls = 1;
  if (!chat.tools.is_array() || chat.tools.empty() || chat.tool_choice_none || chat.options.tool_call_reply ||
      chat.options.json_schema || syntax == ToolCallSyntax::None)
    return;
  ctx.tool_syntax = syntax;
  for (const auto& tool : chat.tools)
    if (tool.contains("function") && tool["function"].is_object() && tool["function"].contains("name") &&
        tool["function"]["name"].is_string())
      ctx.tool_names.push_back(tool["function"]["name"].get<std::string>());
  show_markers(*model.bundle->tokenizer, tool_call_markers(syntax), plan);
}

}  // namespace

struct HttpServer::Impl {
  Impl(const ServeOptions& o, ModelRegistry& r, Log l)
      : options(o),
        registry(r),
        log(std::move(l)),
        started_at(unix_now()),
        stored_responses(static_cast<size_t>(o.responses_ram_mib * 1024 * 1024)),
        scheduler(o.parallel) {}

  ServeOptions options;
  ModelRegistry& registry;
  Log log;
  RequestLimits limits;
  Metrics metrics;
  std::atomic<int> in_flight{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> serving{false};
  std::mutex live_mutex;
  std::vector<std::weak_ptr<GenerationChannel>> live;  // for stop()
  const int64_t started_at;
  int bound_port = -1;
  socket_t listen_socket = INVALID_SOCKET;  // set_socket_options saw it
  ResponseStore stored_responses;           // the Responses API's store: true
  std::atomic<uint64_t> next_job_group{0};  // one scheduler group per request
  // Destroyed bottom-up: the HTTP server (and the responses that stream from
  // channels) first, then the slots, then the monitor the responses watch with.
  DisconnectMonitor monitor;
  Scheduler scheduler;
  httplib::Server http;

  void say(const std::string& message) const {
    if (log) log(message);
  }

  void setup();

  // Generation requests hold a connection thread while queued or streaming.
  // Beyond this many, new ones are refused (503) so a few threads always stay
  // free for /health, /metrics and quick requests.
  int max_generation_requests() const { return std::max(1, options.resolved_http_threads() - kReservedHttpThreads); }
  bool over_capacity() const { return in_flight.load() > max_generation_requests(); }
  ApiError busy_error() const {
    return {503,
            "server is busy: " + std::to_string(max_generation_requests()) +
                " generation requests are already queued or running; retry later",
            "server_error", {}, "server_busy"};
  }
  static constexpr int kReservedHttpThreads = 8;
  bool cors_allows(const std::string& origin) const {
    for (const std::string& o : options.cors_origins)
      if (o == "*" || o == origin) return true;
    return false;
  }
  static ApiError unknown_endpoint_error(const httplib::Request& req) {
    return {404, "Unknown endpoint: " + req.method + " " + req.path, "invalid_request_error", {}, "unknown_url"};
  }
  ApiError body_too_large_error() const {
    return {413,
            "Request body exceeds the server's limit of " + std::to_string(options.max_body_bytes) +
                " bytes (--max-body-bytes)",
            "invalid_request_error", {}, "request_too_large"};
  }
  static ApiError shutting_down_error() {
    return {503, "the server is shutting down; retry the request", "server_error", {}, "server_shutting_down"};
  }
  // `body`: the request's body, read within --max-body-bytes (read_body).
  void handle_chat(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void handle_completions(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // Reads a POST's body into `body`, at most --max-body-bytes of it after
  // decompression; false after replying 413 (or 400 for a body that could
  // not be read). cpp-httplib bounds only a Content-Length body: a chunked
  // body, or a gzip one's decompressed size, it would read whole.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body);
  void handle_models(httplib::Response& res, const std::string& only_id);
  // llama.cpp's utilities: text to tokens, tokens to text, and the prompt a
  // chat request renders to (for token counting and template debugging).
  void handle_tokenize(const std::string& body, httplib::Response& res);
  // vLLM's runtime adapter loading (--allow-lora-loading).
  void handle_load_lora(const std::string& body, httplib::Response& res);
  void handle_unload_lora(const std::string& body, httplib::Response& res);
  void handle_detokenize(const std::string& body, httplib::Response& res);
  void handle_apply_template(const std::string& body, httplib::Response& res);
  void handle_cache_stats(httplib::Response& res);
  void handle_responses(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void handle_embeddings(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void reply_embeddings(httplib::Response& res, const std::vector<ChoiceRun>& runs, const ResponseContext& ctx);
  void handle_stored_response(const httplib::Request& req, httplib::Response& res);
  void handle_input_items(const httplib::Request& req, httplib::Response& res);

  void reply_error(httplib::Response& res, const ApiError& error, const std::string& model, const char* endpoint) {
    reply_json(res, error.status, error_body(error, endpoint));
    metrics.record_request(model, endpoint, error.status);
    if (options.log_requests)
      say(std::string(endpoint) + " " + std::to_string(error.status) + " " + error.message);
  }

  // The model a request names ("": the default) as `model_id`, leased; when
  // it cannot be (unknown: 404, or no room to load it: 503), replies the
  // error and returns nothing.
  std::optional<ModelLease> lease_model(const std::string& requested, httplib::Response& res, const char* endpoint,
                                        std::string& model_id) {
    model_id = requested.empty() ? registry.default_id() : requested;
    Parsed<ModelLease> acquired = registry.acquire(registry.base_of(model_id));
    if (acquired.ok()) return std::move(acquired.value());
    reply_error(res, acquired.error(), acquired.error().status == 404 ? "" : model_id, endpoint);
    return std::nullopt;
  }
  // Anthropic's clients name Claude models (Claude Code asks for two, a
  // large and a small one): a "claude-..." name no served model has means
  // the default model.
  void claude_names_default_model(std::string& model) const {
    if (model.rfind("claude-", 0) != 0) return;
    for (const std::string& id : registry.ids())
      if (id == model) return;
    model.clear();
  }

  // A generation's model: leased (null, answered, when it cannot be),
  // its logit_bias checked against the vocabulary, and its pool woken.
  // Also resolves the adapters it runs with into o.loras (a 400 for an
  // adapter the model does not have).
  std::shared_ptr<ModelLease> lease_for_generation(GenerationOptions& o, httplib::Response& res,
                                                   const char* endpoint, std::string& model_id);

  // One plan per prompt; each runs as the request's n choices.
  void start_generation(const httplib::Request& req, httplib::Response& res, std::shared_ptr<ModelLease> lease,
                        std::vector<GenerationPlan> plans, ResponseContext context);
  void reply_complete(httplib::Response& res, const std::vector<ChoiceRun>& runs, const ResponseContext& ctx);
  bool reply_failure(httplib::Response& res, std::span<const GenerationOutcome> outcomes, const ResponseContext& ctx);
  void reply_built(httplib::Response& res, const std::vector<ChoiceRun>& runs, const ResponseContext& ctx);
  bool stream_built(httplib::DataSink& sink, const std::vector<ChoiceRun>& runs, const ResponseContext& ctx);
  void handle_messages(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void handle_count_tokens(const std::string& body, httplib::Response& res);
  struct MessagesRun {
    std::shared_ptr<ModelLease> lease;
    std::string model_id;
    ResponseContext ctx{};
    GenerationPlan plan;
  };
  // `count_only`: for count_tokens (a prompt longer than the context is counted).
  std::optional<MessagesRun> prepare_messages(const std::string& body, httplib::Response& res, bool count_only);
  void store_response(const ResponseContext& ctx, const ResponseBuilder& builder, const ordered_json& response);
  struct BuiltReply {
    std::unique_ptr<ReplyBuilder> builder;
    std::function<void(const ordered_json& reply)> completed;
  };
  BuiltReply reply_builder(const ResponseContext& ctx, std::string* events);
  // `any_length`: a prompt longer than the context is not an error (a
  // token count, not a generation).
  Parsed<GenerationPlan> chat_plan(LoadedModel& model, const ChatCompletionRequest& chat, ResponseContext& ctx,
                                   const std::string& image_param, bool any_length = false);
  bool stream(httplib::DataSink& sink, const std::vector<ChoiceRun>& runs, const ResponseContext& ctx);
  // One request (status) and its choices' generations (tokens, timings).
  void finish_metrics(const ResponseContext& ctx, std::span<const GenerationOutcome> outcomes, int status);
  // A cancelled request (its client gone) whose job still waits for a slot:
  // the job leaves the queue and runs here, finishing at once as cancelled.
  void leave_queue_if_cancelled(const ChoiceRun& run) {
    if (!run.channel->cancelled()) return;
    if (std::function<void()> job = scheduler.withdraw(run.job)) job();
  }
};

void HttpServer::Impl::setup() {
  const int threads = options.resolved_http_threads();
  // cpp-httplib owns the task queue it is given (its API takes a raw pointer).
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_read_timeout(options.read_timeout_seconds, 0);
  http.set_write_timeout(options.write_timeout_seconds, 0);
  http.set_keep_alive_timeout(5);
  // Replies and stream events are small writes: with Nagle's algorithm a
  // write waits for the ACK of the previous one, which a client delays by up
  // to ~40 ms, so on a kept-alive connection a short completion took a
  // median 44 ms instead of 3 (docs/performance.md, session 43).
  http.set_tcp_nodelay(true);
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on
  // the same port starts without an error and takes half the connections.
  // SO_REUSEADDR alone still lets a restarted server bind at once. The
  // socket is kept so that its listen backlog can be raised after binding.
  http.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_socket = sock;
  });

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // CORS (--cors-origin): an allowed page's requests get its origin back;
    // its preflight is answered here, before the API key is asked for
    // (browsers send preflights without credentials).
    const std::string origin = req.get_header_value("Origin");
    const bool cors = !origin.empty() && cors_allows(origin);
    if (cors) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      if (!cors) {
        reply_error(res, unknown_endpoint_error(req), "", endpoint_label(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      // The headers the page asks to send (the SDKs send their own:
      // x-api-key, anthropic-version, x-stainless-*), for an allowed origin;
      // only header-name characters are echoed.
      std::string asked = req.get_header_value("Access-Control-Request-Headers");
      const bool plain = asked.size() <= 2048 && asked.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_, ") == std::string::npos;
      res.set_header("Access-Control-Allow-Headers",
                     std::string("Authorization, Content-Type") + (plain && !asked.empty() ? ", " + asked : ""));
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (ambiguous_length(req)) {
      res.set_header("Connection", "close");
      reply_error(res,
                  ApiError::invalid("malformed request framing: one decimal Content-Length, or Transfer-Encoding "
                                    "without it",
                                    "", "bad_request_framing"),
                  "", endpoint_label(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    // DELETE of a stored response takes no body: one would be read (and
    // inflated) whole by cpp-httplib, outside read_body's bounds.
    if (req.method == "DELETE" && is_response_path(req.path) &&
        (req.has_header("Transfer-Encoding") || req.has_header("Content-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0"))) {
      res.set_header("Connection", "close");
      reply_error(res, ApiError::invalid("DELETE takes no request body", "", "unexpected_body"), "",
                  endpoint_label(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    // A method that carries a body, to a path that takes none: answered
    // before cpp-httplib reads the body (which it would, unbounded if chunked).
    const bool body_method = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                             req.method == "DELETE" || req.method == "PRI";
    if (body_method && !takes_body(req)) {
      res.set_header("Connection", "close");
      reply_error(res, unknown_endpoint_error(req), "", endpoint_label(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options.api_key.empty() || req.path == "/health" || req.path == "/v1/health")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    // Anthropic's clients send the key as x-api-key.
    if (req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    ApiError error{401,
                   auth.empty() && !req.has_header("x-api-key")
                       ? "Missing API key: send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"
                       : "Invalid API key",
                   "invalid_request_error", {}, "invalid_api_key"};
    reply_error(res, error, "", endpoint_label(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });

  // Fills in a JSON body for statuses cpp-httplib produces itself (404, 413,
  // malformed HTTP); responses that already have a body are left alone.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError error;
    error.status = res.status;
    if (res.status == 404) {
      error = unknown_endpoint_error(req);
    } else if (res.status == 413) {
      error = body_too_large_error();
    } else if (res.status >= 500) {
      error.type = "server_error";
      error.message = "internal server error";
    } else {
      error.message = "Bad request";
    }
    reply_json(res, error.status, error_json(error));
    metrics.record_request("", endpoint_label(req.path), error.status);
  });

  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, ApiError::server("internal error: " + what), "", endpoint_label(req.path));
  });

  auto health = [this](const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200, {{"status", "ok"}});
    metrics.record_request("", "health", 200);
  };
  http.Get("/health", health);
  http.Get("/v1/health", health);
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    SchedulerSnapshot s{scheduler.slots(), scheduler.queued(), scheduler.running()};
    metrics.record_request("", "metrics", 200);
    res.set_content(metrics.prometheus(registry.status(), s, in_flight.load(), registry.shared_cache_budget()), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { handle_models(res, {}); });
  http.Get("/models", [this](const httplib::Request&, httplib::Response& res) { handle_models(res, {}); });
  auto one_model = [this](const httplib::Request& req, httplib::Response& res) {
    handle_models(res, req.matches[1].str());
  };
  http.Get(R"(/v1/models/(.+))", one_model);
  http.Get(R"(/models/(.+))", one_model);
  http.Get("/v1/cache/stats", [this](const httplib::Request&, httplib::Response& res) { handle_cache_stats(res); });
  // llama.cpp's list of adapters (its ids are what `lora` fields give).
  // Adapters apply only to requests that ask for them, so every scale is 0.
  http.Get("/lora-adapters", [this](const httplib::Request&, httplib::Response& res) {
    // An adapter's id is its index among its model's adapters (what a
    // request's lora field names).
    ordered_json list = ordered_json::array();
    std::map<std::string, size_t> per_model;
    for (const AdapterSource& a : registry.adapters())
      list.push_back({{"id", per_model[a.base]++}, {"name", a.name}, {"path", a.path}, {"scale", 0.0},
                      {"model", a.base}});
    reply_json(res, 200, list);
    metrics.record_request("", "lora_adapters", 200);
  });
  // llama.cpp sets every request's adapter scales here; reprise applies
  // adapters only to the requests that ask for them.
  http.Post("/lora-adapters", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Allow", "GET");
    reply_error(res,
                ApiError{405, "adapters apply per request here: name one as the model, or give the lora field "
                              "[{\"id\", \"scale\"}]; GET /lora-adapters lists them",
                         "invalid_request_error", {}, "method_not_allowed"},
                "", "lora_adapters");
  });
  auto chat = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handle_chat(req, body, res);
  };
  http.Post("/v1/chat/completions", chat);
  http.Post("/chat/completions", chat);
  auto completions = [this](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handle_completions(req, body, res);
  };
  http.Post("/v1/completions", completions);
  http.Post("/completions", completions);
  auto responses = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handle_responses(req, body, res);
  };
  http.Post("/v1/responses", responses);
  http.Post("/responses", responses);
  auto embeddings = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handle_embeddings(req, body, res);
  };
  http.Post("/v1/embeddings", embeddings);
  http.Post("/embeddings", embeddings);
  auto stored = [this](const httplib::Request& req, httplib::Response& res) { handle_stored_response(req, res); };
  for (const char* path : {R"(/v1/responses/([^/]+))", R"(/responses/([^/]+))"}) {
    http.Get(path, stored);
    http.Delete(path, stored);
  }
  auto input_items = [this](const httplib::Request& req, httplib::Response& res) { handle_input_items(req, res); };
  http.Get(R"(/v1/responses/([^/]+)/input_items)", input_items);
  http.Get(R"(/responses/([^/]+)/input_items)", input_items);
  auto utility = [this](void (Impl::*handler)(const std::string&, httplib::Response&)) {
    return [this, handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) (this->*handler)(body, res);
    };
  };
  http.Post("/tokenize", utility(&Impl::handle_tokenize));
  http.Post("/v1/load_lora_adapter", utility(&Impl::handle_load_lora));
  http.Post("/v1/unload_lora_adapter", utility(&Impl::handle_unload_lora));
  http.Post("/detokenize", utility(&Impl::handle_detokenize));
  http.Post("/apply-template", utility(&Impl::handle_apply_template));
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handle_messages(req, body, res);
  });
  http.Post("/v1/messages/count_tokens", utility(&Impl::handle_count_tokens));
}

bool HttpServer::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader, std::string& body) {
  const size_t limit = options.max_body_bytes;
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (n > limit - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (read) return true;
  // The rest of the body is still unread: the connection cannot carry
  // another request.
  res.set_header("Connection", "close");
  const char* endpoint = endpoint_label(req.path);
  if (too_large || res.status == 413) {
    reply_error(res, body_too_large_error(), "", endpoint);
  } else {
    reply_error(res, ApiError::invalid("the request body could not be read (truncated, or a bad encoding)", "", "invalid_body"),
                "", endpoint);
  }
  return false;
}

// Model entries carry OpenAI's fields and Anthropic's (type, display_name,
// created_at), so both APIs' clients can list them.
void HttpServer::Impl::handle_models(httplib::Response& res, const std::string& only_id) {
  char created_at[32];
  const std::time_t started = static_cast<std::time_t>(started_at);
  std::tm utc{};
  gmtime_r(&started, &utc);
  std::strftime(created_at, sizeof created_at, "%Y-%m-%dT%H:%M:%SZ", &utc);
  ordered_json data = ordered_json::array();
  // OpenAI's fields and Anthropic's (type, display_name, created_at).
  auto entry = [&](const std::string& id) {
    return ordered_json{{"id", id},           {"object", "model"},    {"created", started_at},
                        {"owned_by", "reprise"}, {"type", "model"}, {"display_name", id},
                        {"created_at", created_at}};
  };
  const std::vector<ModelStatus> statuses = registry.status();
  for (const ModelStatus& s : statuses) {
    if (!only_id.empty() && s.id != only_id) continue;
    ordered_json m = entry(s.id);
    m["loaded"] = s.loaded;
    data.push_back(std::move(m));
  }
  // Each adapter is a model of its own to clients (vLLM's convention), run
  // on its base model's weights.
  for (const AdapterSource& a : registry.adapters()) {
    if (!only_id.empty() && a.name != only_id) continue;
    const std::string& base = a.base;
    ordered_json m = entry(a.name);
    m["parent"] = base;
    m["root"] = base;
    bool loaded = false;
    for (const ModelStatus& s : statuses) loaded = loaded || (s.id == base && s.loaded);
    m["loaded"] = loaded;
    data.push_back(std::move(m));
  }
  if (!only_id.empty()) {
    if (data.empty())
      return reply_error(res, ApiError{404, "The model '" + only_id + "' does not exist", "invalid_request_error",
                                       "model", "model_not_found"},
                         "", "models");
    reply_json(res, 200, data[0]);
  } else {
    reply_json(res, 200, list_page(std::move(data), false));
  }
  metrics.record_request("", "models", 200);
}

namespace {
ApiError lora_loading_disabled() {
  return ApiError{403, "loading and unloading LoRA adapters at run time is off: start the server with "
                       "--allow-lora-loading (or give adapters with --lora at start-up)",
                  "invalid_request_error", {}, "lora_loading_disabled"};
}
}  // namespace

// vLLM's: {"lora_name", "lora_path"} (and reprise's "model": the adapter's
// model, the default one when absent) -> 200 and a line of text.
void HttpServer::Impl::handle_load_lora(const std::string& body, httplib::Response& res) {
  const char* endpoint = "load_lora_adapter";
  if (!options.allow_lora_loading) return reply_error(res, lora_loading_disabled(), "", endpoint);
  Parsed<LoraAdapterRequest> parsed = parse_lora_adapter_request(body, limits, /*with_path=*/true);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  const std::string name = parsed.value().name;
  if (auto bad = registry.add_adapter({name, parsed.value().path, parsed.value().model, nullptr}))
    return reply_error(res, *bad, "", endpoint);
  res.status = 200;
  res.set_content("Success: LoRA adapter '" + name + "' added successfully.", "text/plain; charset=utf-8");
  metrics.record_request("", endpoint, 200);
}

void HttpServer::Impl::handle_unload_lora(const std::string& body, httplib::Response& res) {
  const char* endpoint = "unload_lora_adapter";
  if (!options.allow_lora_loading) return reply_error(res, lora_loading_disabled(), "", endpoint);
  Parsed<LoraAdapterRequest> parsed = parse_lora_adapter_request(body, limits, /*with_path=*/false);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  if (auto bad = registry.remove_adapter(parsed.value().name)) return reply_error(res, *bad, "", endpoint);
  res.status = 200;
  res.set_content("Success: LoRA adapter '" + parsed.value().name + "' removed successfully.",
                  "text/plain; charset=utf-8");
  metrics.record_request("", endpoint, 200);
}

void HttpServer::Impl::handle_tokenize(const std::string& body, httplib::Response& res) {
  const char* endpoint = "tokenize";
  Parsed<TokenizeRequest> parsed = parse_tokenize_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  const TokenizeRequest& r = parsed.value();
  std::string model_id;
  const std::optional<ModelLease> lease = lease_model(r.model, res, endpoint, model_id);
  if (!lease) return;
  const Tokenizer& tokenizer = *(**lease).bundle->tokenizer;
  std::vector<int32_t> tokens;
  try {
    tokens = tokenizer.encode(r.content, /*add_special=*/false, r.parse_special);
  } catch (const std::exception& e) {
    return reply_error(res, ApiError::invalid(std::string("cannot tokenize the content: ") + e.what(), "content"),
                       model_id, endpoint);
  }
  const int32_t bos = tokenizer.bos_id();
  if (r.add_special && tokenizer.add_bos() && bos >= 0 && (tokens.empty() || tokens.front() != bos))
    tokens.insert(tokens.begin(), bos);
  ordered_json out = ordered_json::array();
  for (int32_t id : tokens) {
    if (!r.with_pieces) {
      out.push_back(id);
      continue;
    }
    // A piece that is not whole UTF-8 (a byte token, part of a character)
    // goes out as its bytes, as llama.cpp's does.
    std::string piece = tokenizer.token_to_piece(id, /*render_special=*/true);
    ordered_json value = piece;
    try {
      (void)value.dump();
    } catch (const ordered_json::exception&) {
      value = ordered_json::array();
      for (unsigned char c : piece) value.push_back(static_cast<int>(c));
    }
    out.push_back({{"id", id}, {"piece", std::move(value)}});
  }
  reply_json(res, 200, {{"tokens", std::move(out)}});
  metrics.record_request(model_id, endpoint, 200);
}

void HttpServer::Impl::handle_detokenize(const std::string& body, httplib::Response& res) {
  const char* endpoint = "detokenize";
  Parsed<DetokenizeRequest> parsed = parse_detokenize_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  const DetokenizeRequest& r = parsed.value();
  std::string model_id;
  const std::optional<ModelLease> lease = lease_model(r.model, res, endpoint, model_id);
  if (!lease) return;
  const LoadedModel& model = **lease;
  const Tokenizer& tokenizer = *model.bundle->tokenizer;
  const int64_t n_vocab = model.bundle->model->info().n_vocab;
  std::vector<int32_t> known;  // ids the model has but the tokenizer does not (padding) show as nothing
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (r.tokens[i] >= n_vocab)
      return reply_error(res,
                         ApiError::invalid("token id " + std::to_string(r.tokens[i]) +
                                               " is outside the model's vocabulary of " + std::to_string(n_vocab),
                                           "tokens[" + std::to_string(i) + "]"),
                         model_id, endpoint);
    if (r.tokens[i] < tokenizer.n_vocab()) known.push_back(r.tokens[i]);
  }
  reply_json(res, 200, {{"content", tokenizer.detokenize(known)}});
  metrics.record_request(model_id, endpoint, 200);
}

void HttpServer::Impl::handle_apply_template(const std::string& body, httplib::Response& res) {
  const char* endpoint = "apply_template";
  Parsed<ChatCompletionRequest> parsed = parse_chat_completion_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  const ChatCompletionRequest& chat = parsed.value();
  std::string model_id;
  const std::optional<ModelLease> lease = lease_model(chat.options.model, res, endpoint, model_id);
  if (!lease) return;
  const LoadedModel& model = **lease;
  if (chat.first_image_message && !model.vision) {
    const std::string param = "messages[" + std::to_string(*chat.first_image_message) + "].content";
    return reply_error(res, ApiError::invalid("this model does not accept images", param, "images_not_supported"),
                       model_id, endpoint);
  }
  Parsed<std::string> prompt = render_chat_prompt(model.chat, *model.bundle->tokenizer, chat);
  if (!prompt.ok()) return reply_error(res, prompt.error(), model_id, endpoint);
  reply_json(res, 200, {{"prompt", prompt.value()}});
  metrics.record_request(model_id, endpoint, 200);
}

void HttpServer::Impl::handle_cache_stats(httplib::Response& res) {
  ordered_json models = ordered_json::array();
  CacheStats total;
  for (const ModelStatus& s : registry.status()) {
    const CacheStats& c = s.cache;
    ordered_json cache = {{"lookups", c.lookups},
                          {"hits", c.hits},
                          {"misses", c.misses},
                          {"tokens_looked_up", c.tokens_looked_up},
                          {"tokens_reused", c.tokens_reused},
                          {"evictions", c.evictions},
                          {"copies_on_write", c.copies_on_write},
                          {"blocks", c.blocks},
                          {"blocks_in_use", c.blocks_in_use},
                          {"blocks_cached", c.blocks_cached},
                          {"blocks_shared", c.blocks_shared},
                          {"bytes", c.bytes},
                          {"bytes_in_use", c.bytes_in_use},
                          {"budget_bytes", c.budget_bytes}};
    ordered_json m = {{"id", s.id},
                      {"loaded", s.loaded},
                      {"in_flight", s.in_flight},
                      {"loads", s.loads},
                      {"unloads", s.unloads},
                      {"n_ctx", s.n_ctx},
                      {"block_tokens", s.block_tokens},
                      {"fingerprint", s.fingerprint_hex},
                      {"chat_template", s.chat_template_origin},
                      {"cache", std::move(cache)}};
    models.push_back(std::move(m));
    total.lookups += c.lookups;
    total.hits += c.hits;
    total.misses += c.misses;
    total.tokens_reused += c.tokens_reused;
    total.evictions += c.evictions;
    total.blocks += c.blocks;
    total.bytes += c.bytes;
  }
  ordered_json totals = {{"lookups", total.lookups}, {"hits", total.hits},         {"misses", total.misses},
                         {"tokens_reused", total.tokens_reused}, {"evictions", total.evictions},
                         {"blocks", total.blocks}, {"bytes", total.bytes}};
  reply_json(res, 200, {{"models", std::move(models)}, {"totals", std::move(totals)}});
  metrics.record_request("", "cache_stats", 200);
}

namespace {

GenerationPlan make_plan(const GenerationOptions& o, BuiltPrompt prompt) {
  GenerationPlan plan;
  plan.prompt = std::move(prompt.tokens);
  plan.sampling = o.sampling;
  if (!o.seed_given) plan.sampling.seed = random_seed();
  plan.max_tokens = o.max_tokens.value_or(-1);
  plan.stop = o.stop;
  for (std::string& s : prompt.implicit_stops) plan.stop.push_back(std::move(s));
  plan.logprobs = o.logprobs;
  plan.top_logprobs = o.top_logprobs;
  plan.cache_salt = o.cache_salt;
  plan.draft_max = o.draft_max;
  plan.ignore_eos = o.ignore_eos;
  plan.json_schema = o.json_schema;
  plan.opens_reasoning = prompt.opens_reasoning;
  return plan;
}

// Token ids echoed as text: their pieces joined, with no clean-up, so the
// text is what the echoed logprobs' tokens spell.
std::string joined_pieces(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  std::string text;
  for (int32_t id : ids) text += model_token_piece(tokenizer, id);
  return text;
}

std::vector<GenerationPlan> single(GenerationPlan plan) {
  std::vector<GenerationPlan> plans;
  plans.push_back(std::move(plan));
  return plans;
}

// A chat with images: each image is decoded and encoded (the encoder cache
// makes repeats free), the template is rendered with a marker per image, and
// the image soft tokens are spliced in with their digests as cache keys.
Parsed<GenerationPlan> make_image_plan(LoadedModel& model, const ChatCompletionRequest& chat, int64_t n_ctx) {
  std::vector<ImageEmbeddingPtr> images;
  for (const ImageRef& ref : chat.images) {
    try {
      images.push_back(model.vision->embed_data_url(ref.url, chat.options.cache_salt));
    } catch (const std::exception& e) {
      return ApiError::invalid(std::string("invalid image: ") + e.what(), ref.param, "invalid_image");
    }
  }
  Parsed<std::string> text = render_chat_prompt(model.chat, *model.bundle->tokenizer, chat);
  if (!text.ok()) return text.error();
  MultimodalPrompt prompt;
  try {
    prompt = model.vision->build_prompt(text.value(), images);
  } catch (const std::exception& e) {
    return ApiError::invalid(std::string("cannot build the prompt: ") + e.what(), "messages");
  }
  const int64_t n = static_cast<int64_t>(prompt.tokens.size());
  if (n >= n_ctx)
    return ApiError::invalid("This model's maximum context length is " + std::to_string(n_ctx) +
                                 " tokens. However, your messages resulted in " + std::to_string(n) + " tokens.",
                             "messages", "context_length_exceeded");
  BuiltPrompt built;
  built.tokens = prompt.tokens;
  built.implicit_stops = model.chat.implicit_stops;
  built.opens_reasoning = chat_prompt_opens_reasoning(model.chat, text.value());
  GenerationPlan plan = make_plan(chat.options, std::move(built));
  plan.prompt_keys = prompt.keys;
  for (const PromptImage& img : prompt.images) {
    plan.embedded.push_back({img.begin, img.end, img.embedding->values.data(), prompt.bidirectional_images});
    plan.keep_alive.push_back(img.embedding);
  }
  return plan;
}

// OpenAI's system_fingerprint: what computed the reply. The model's
// fingerprint, and with adapters a hash of theirs and their scales too, so
// that replies of different computations never carry the same one.
std::string system_fingerprint(const LoadedModel& model, const GenerationOptions& o) {
  if (o.loras.empty()) return "fp_" + model.fingerprint_hex;
  const std::string identity = model.fingerprint_hex + "|" + lora_identity(o.loras);
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash_bytes(identity.data(), identity.size()).lo));
  return std::string("fp_") + hex;
}

// The adapters a request runs with: the one its model names (at scale 1),
// and those of its `lora` field (whose scale wins for the same adapter), in
// the model's order (so that the same set in any order shares its cache),
// without those at scale 0 (the base model's computation).
Parsed<std::vector<LoraUse>> resolve_loras(const LoadedModel& model, const std::string& model_id,
                                          const std::vector<LoraRequest>& asked) {
  const std::vector<ServedAdapter> adapters = model.adapters();
  std::vector<std::optional<float>> scales(adapters.size());
  bool found = model_id == model.id;
  for (size_t i = 0; i < adapters.size(); ++i)
    if (adapters[i].name == model_id) {
      scales[i] = 1.0f;
      found = true;
    }
  // A model id that names no model's adapter now (removed since it was
  // looked up) must not run the base model under the adapter's name.
  if (!found)
    return ApiError{404, "The model '" + model_id + "' does not exist", "invalid_request_error", "model",
                    "model_not_found"};
  std::vector<bool> named(adapters.size(), false);
  for (size_t k = 0; k < asked.size(); ++k) {
    const LoraRequest& r = asked[k];
    const std::string param = "lora[" + std::to_string(k) + "].id";
    size_t index = adapters.size();
    for (size_t i = 0; i < adapters.size(); ++i)
      if (r.index >= 0 ? static_cast<size_t>(r.index) == i : adapters[i].name == r.name) index = i;
    if (index == adapters.size()) {
      std::string known;
      for (size_t i = 0; i < adapters.size(); ++i)
        known += (i ? ", " : "") + std::to_string(i) + " '" + adapters[i].name + "'";
      const std::string what = r.index >= 0 ? "index " + std::to_string(r.index) : "'" + r.name + "'";
      return ApiError::invalid("no LoRA adapter " + what + " on model '" + model.id + "' (" +
                                   (known.empty() ? "it has none" : "it has " + known) + ")",
                               param, "lora_not_found");
    }
    if (named[index]) return ApiError::invalid("lora names adapter '" + adapters[index].name + "' twice", param);
    named[index] = true;
    scales[index] = r.scale;
  }
  std::vector<LoraUse> uses;
  for (size_t i = 0; i < adapters.size(); ++i)
    if (scales[i] && *scales[i] != 0.0f) uses.push_back({adapters[i].adapter, *scales[i]});
  return uses;
}

}  // namespace

std::shared_ptr<ModelLease> HttpServer::Impl::lease_for_generation(GenerationOptions& o, httplib::Response& res,
                                                                  const char* endpoint, std::string& model_id) {
  std::optional<ModelLease> acquired = lease_model(o.model, res, endpoint, model_id);
  if (!acquired) return nullptr;
  auto lease = std::make_shared<ModelLease>(std::move(*acquired));
  if (auto bad = check_logit_bias(o, (*lease)->bundle->model->info().n_vocab)) {
    reply_error(res, *bad, model_id, endpoint);
    return nullptr;
  }
  Parsed<std::vector<LoraUse>> loras = resolve_loras(**lease, model_id, o.lora);
  if (!loras.ok()) {
    reply_error(res, loras.error(), model_id, endpoint);
    return nullptr;
  }
  o.loras = std::move(loras.value());
  (*lease)->engine->expect_request();
  return lease;
}

void HttpServer::Impl::handle_chat(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  InFlight guard(in_flight);
  const char* endpoint = endpoint_name(Endpoint::Chat);
  if (over_capacity()) return reply_error(res, busy_error(), "", endpoint);
  Parsed<ChatCompletionRequest> parsed = parse_chat_completion_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  ChatCompletionRequest& chat = parsed.value();
  std::string model_id;
  std::shared_ptr<ModelLease> lease = lease_for_generation(chat.options, res, endpoint, model_id);
  if (!lease) return;
  LoadedModel& model = **lease;
  ResponseContext ctx{Endpoint::Chat,
                      {make_response_id("chatcmpl-"), unix_now(), model_id, system_fingerprint(model, chat.options)},
                      chat.options};
  const std::string image_param =
      chat.first_image_message ? "messages[" + std::to_string(*chat.first_image_message) + "].content" : "";
  Parsed<GenerationPlan> plan = chat_plan(model, chat, ctx, image_param);
  if (!plan.ok()) return reply_error(res, plan.error(), model_id, endpoint);
  start_generation(req, res, std::move(lease), single(std::move(plan.value())), std::move(ctx));
}

// A chat's generation: its prompt (with images, when it has them), and
// how its reply is read back (tool calls, reasoning).
Parsed<GenerationPlan> HttpServer::Impl::chat_plan(LoadedModel& model, const ChatCompletionRequest& chat,
                                                   ResponseContext& ctx, const std::string& image_param,
                                                   bool any_length) {
  if (chat.first_image_message && !model.vision)
    return ApiError::invalid("this model does not accept images", image_param, "images_not_supported");
  const int64_t n_ctx = any_length ? std::numeric_limits<int64_t>::max() : model.engine->n_ctx();
  Parsed<GenerationPlan> plan = [&]() -> Parsed<GenerationPlan> {
    if (chat.first_image_message) return make_image_plan(model, chat, n_ctx);
    Parsed<BuiltPrompt> prompt = build_chat_prompt(model.chat, *model.bundle->tokenizer, n_ctx, chat);
    if (!prompt.ok()) return prompt.error();
    return make_plan(chat.options, std::move(prompt.value()));
  }();
  if (!plan.ok()) return plan;
  expect_tool_calls(chat, model, ctx, plan.value());
  expect_reasoning(chat, model, ctx, plan.value());
  return plan;
}

void HttpServer::Impl::handle_completions(const httplib::Request& req, const std::string& body,
                                          httplib::Response& res) {
  InFlight guard(in_flight);
  const char* endpoint = endpoint_name(Endpoint::Completions);
  if (over_capacity()) return reply_error(res, busy_error(), "", endpoint);
  Parsed<CompletionRequest> parsed = parse_completion_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  CompletionRequest& completion = parsed.value();
  std::string model_id;
  std::shared_ptr<ModelLease> lease = lease_for_generation(completion.options, res, endpoint, model_id);
  if (!lease) return;
  LoadedModel& model = **lease;
  const Tokenizer& tokenizer = *model.bundle->tokenizer;
  std::vector<GenerationPlan> plans;
  for (size_t i = 0; i < completion.prompts.size(); ++i) {
    const CompletionPrompt& one = completion.prompts[i];
    Parsed<BuiltPrompt> prompt =
        build_completion_prompt(tokenizer, model.engine->n_ctx(), model.bundle->model->info().n_vocab, one,
                                completion.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt");
    if (!prompt.ok()) return reply_error(res, prompt.error(), model_id, endpoint);
    GenerationPlan plan = make_plan(completion.options, std::move(prompt.value()));
    if (completion.echo) plan.echo = one.is_tokens ? joined_pieces(tokenizer, one.tokens) : one.text;
    plans.push_back(std::move(plan));
  }
  ResponseContext ctx{Endpoint::Completions,
                      {make_response_id("cmpl-"), unix_now(), model_id, system_fingerprint(model, completion.options)},
                      completion.options};
  start_generation(req, res, std::move(lease), std::move(plans), std::move(ctx));
}

namespace {

// A Response's fields other than its status, output and usage: its id and
// model, the request's echoed fields, and the sampling it ran with.
ordered_json response_shell(const ResponseContext& ctx) {
  ordered_json shell = {{"id", ctx.meta.id}, {"created_at", ctx.meta.created}, {"model", ctx.meta.model}};
  for (const auto& [key, value] : ctx.responses->echoed.items()) shell[key] = value;
  // Floats shown as the decimals they were given as (0.8, not 0.800000011920929).
  auto decimal = [](float v) { return std::round(static_cast<double>(v) * 1e6) / 1e6; };
  shell["temperature"] = decimal(ctx.options.sampling.temperature);
  shell["top_p"] = decimal(ctx.options.sampling.top_p);
  return shell;
}

ApiError response_not_found(const std::string& id) {
  return ApiError{404, "Response with id '" + id + "' not found.", "invalid_request_error", {}, "not_found"};
}

// previous_response_id names a response that is not stored (for this
// tenant), or one whose conversation lost an earlier turn (`missing`):
// OpenAI's 400.
ApiError previous_response_not_found(const std::string& id, const std::string& missing) {
  std::string message = "Previous response with id '" + id + "' not found.";
  if (missing != id)
    message = "Previous response with id '" + id + "' continues response '" + missing +
              "', which is no longer stored.";
  return ApiError::invalid(std::move(message), "previous_response_id", "previous_response_not_found");
}

}  // namespace

void HttpServer::Impl::handle_responses(const httplib::Request& req, const std::string& body,
                                        httplib::Response& res) {
  InFlight guard(in_flight);
  const char* endpoint = endpoint_name(Endpoint::Responses);
  if (over_capacity()) return reply_error(res, busy_error(), "", endpoint);
  Parsed<ResponsesRequest> parsed = parse_responses_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  if (options.responses_ram_mib <= 0) parsed.value().echoed["store"] = parsed.value().store = false;  // stores none
  auto request = std::make_shared<const ResponsesRequest>(std::move(parsed.value()));
  ordered_json history = ordered_json::array();
  if (!request->previous_response_id.empty()) {
    std::string missing;
    std::optional<ordered_json> stored =
        stored_responses.conversation(request->previous_response_id, request->cache_salt, &missing);
    if (!stored)
      return reply_error(res, previous_response_not_found(request->previous_response_id, missing), "", endpoint);
    history = std::move(*stored);
  }
  Parsed<ChatCompletionRequest> chat_parsed = responses_chat_request(*request, history, limits);
  if (!chat_parsed.ok()) return reply_error(res, chat_parsed.error(), "", endpoint);
  ChatCompletionRequest& chat = chat_parsed.value();
  std::string model_id;
  std::shared_ptr<ModelLease> lease = lease_for_generation(chat.options, res, endpoint, model_id);
  if (!lease) return;
  LoadedModel& model = **lease;
  ResponseContext ctx{Endpoint::Responses,
                      {make_response_id("resp_"), unix_now(), model_id, system_fingerprint(model, chat.options)},
                      chat.options};
  ctx.responses = request;
  Parsed<GenerationPlan> plan = chat_plan(model, chat, ctx, "input");
  if (!plan.ok()) return reply_error(res, in_responses_terms(plan.error()), model_id, endpoint);
  start_generation(req, res, std::move(lease), single(std::move(plan.value())), std::move(ctx));
}

// POST /v1/embeddings: each input is a sequence of its own (its prefix
// reused from the cache where the pooling allows), pooled into one
// unit-length vector.
void HttpServer::Impl::handle_embeddings(const httplib::Request& req, const std::string& body,
                                         httplib::Response& res) {
  InFlight guard(in_flight);
  const char* endpoint = endpoint_name(Endpoint::Embeddings);
  if (over_capacity()) return reply_error(res, busy_error(), "", endpoint);
  Parsed<EmbeddingsRequest> parsed = parse_embeddings_request(body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "", endpoint);
  const EmbeddingsRequest& request = parsed.value();
  GenerationOptions options_seen;
  options_seen.model = request.model;
  options_seen.cache_salt = request.cache_salt;
  options_seen.lora = request.lora;
  std::string model_id;
  std::shared_ptr<ModelLease> lease = lease_for_generation(options_seen, res, endpoint, model_id);
  if (!lease) return;
  LoadedModel& model = **lease;
  const ModelInfo& info = model.bundle->model->info();
  const Pooling fallback = pooling_from_name(options.pooling).value_or(Pooling::Last);
  Parsed<Pooling> pooling = options.pooling.empty() ? model_pooling(*model.bundle->file, info.arch, fallback)
                                                    : Parsed<Pooling>(fallback);
  if (!pooling.ok()) return reply_error(res, pooling.error(), model_id, endpoint);
  if (request.dimensions && *request.dimensions > info.n_embd)
    return reply_error(res,
                       ApiError::invalid("dimensions must be at most " + std::to_string(info.n_embd) +
                                             " (this model's embedding width)",
                                         "dimensions"),
                       model_id, endpoint);
  std::vector<GenerationPlan> plans;
  size_t total_tokens = 0;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const std::string param = request.inputs.size() > 1 ? "input[" + std::to_string(i) + "]" : "input";
    Parsed<std::vector<int32_t>> tokens = embedding_input(*model.bundle->tokenizer, request.inputs[i], info.n_vocab,
                                                          model.engine->n_ctx(), param);
    if (!tokens.ok()) return reply_error(res, tokens.error(), model_id, endpoint);
    // One request's inputs queue as one job each: bounded in all, so a
    // single request cannot hold every slot for minutes.
    total_tokens += tokens.value().size();
    if (total_tokens > limits.max_embedding_tokens)
      return reply_error(res,
                         ApiError::invalid("the inputs of one request may hold at most " +
                                               std::to_string(limits.max_embedding_tokens) + " tokens in all",
                                           "input", "too_many_tokens"),
                         model_id, endpoint);
    GenerationPlan plan;
    plan.prompt = std::move(tokens.value());
    plan.cache_salt = request.cache_salt;
    plan.embedding_pooling = pooling.value();
    plan.embedding_dimensions = request.dimensions;
    plans.push_back(std::move(plan));
  }
  ResponseContext ctx{Endpoint::Embeddings,
                      {make_response_id("req_"), unix_now(), model_id, system_fingerprint(model, options_seen)},
                      options_seen};
  ctx.embeddings_base64 = request.base64;
  start_generation(req, res, std::move(lease), std::move(plans), std::move(ctx));
}

// A Messages request up to its generation's plan: parsed, a Claude model
// name resolved, its model leased, tool results' images dropped for a model
// that reads none, its prompt built. Nothing (the error answered) when a
// step fails.
std::optional<HttpServer::Impl::MessagesRun> HttpServer::Impl::prepare_messages(const std::string& body,
                                                                                httplib::Response& res,
                                                                                bool count_only) {
  const char* endpoint = endpoint_name(Endpoint::Messages);
  Parsed<MessagesRequest> parsed = parse_messages_request(body, limits);
  if (!parsed.ok()) {
    reply_error(res, parsed.error(), "", endpoint);
    return std::nullopt;
  }
  MessagesRequest& request = parsed.value();
  claude_names_default_model(request.chat.options.model);
  MessagesRun run;
  run.lease = lease_for_generation(request.chat.options, res, endpoint, run.model_id);
  if (!run.lease) return std::nullopt;
  LoadedModel& model = **run.lease;
  if (request.chat.first_image_message && !model.vision) drop_tool_result_images(request);
  run.ctx = ResponseContext{Endpoint::Messages,
                            {make_response_id("msg_"), unix_now(), run.model_id, system_fingerprint(model, request.chat.options)},
                            request.chat.options};
  Parsed<GenerationPlan> plan = chat_plan(model, request.chat, run.ctx, "messages", count_only);
  if (!plan.ok()) {
    reply_error(res, plan.error(), run.model_id, endpoint);
    return std::nullopt;
  }
  run.plan = std::move(plan.value());
  run.ctx.prompt_tokens = static_cast<int64_t>(run.plan.prompt.size());
  return run;
}

// POST /v1/messages: Anthropic's Messages API, run as the chat completion
// it means (messages_request.h).
void HttpServer::Impl::handle_messages(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  InFlight guard(in_flight);
  if (over_capacity()) return reply_error(res, busy_error(), "", endpoint_name(Endpoint::Messages));
  std::optional<MessagesRun> run = prepare_messages(body, res, /*count_only=*/false);
  if (!run) return;
  start_generation(req, res, std::move(run->lease), single(std::move(run->plan)), std::move(run->ctx));
}

// POST /v1/messages/count_tokens: the prompt a Messages request would run,
// also one longer than the context (agents count to know when to compact).
void HttpServer::Impl::handle_count_tokens(const std::string& body, httplib::Response& res) {
  std::optional<MessagesRun> run = prepare_messages(body, res, /*count_only=*/true);
  if (!run) return;
  reply_json(res, 200, {{"input_tokens", run->ctx.prompt_tokens}});
  metrics.record_request(run->model_id, endpoint_name(Endpoint::Messages), 200);
}

// GET /v1/responses/{id} returns a stored response, DELETE removes it. The
// cache_salt query parameter names the tenant it was stored under.
void HttpServer::Impl::handle_stored_response(const httplib::Request& req, httplib::Response& res) {
  const char* endpoint = endpoint_name(Endpoint::Responses);
  const std::string id = req.matches[1].str();
  const std::string salt = req.get_param_value("cache_salt");
  if (req.method == "DELETE") {
    if (!stored_responses.erase(id, salt)) return reply_error(res, response_not_found(id), "", endpoint);
    reply_json(res, 200, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
  } else {
    std::shared_ptr<const StoredResponse> stored = stored_responses.get(id, salt);
    if (!stored) return reply_error(res, response_not_found(id), "", endpoint);
    res.status = 200;
    res.set_content(stored->response, "application/json");
  }
  metrics.record_request("", endpoint, 200);
}

// GET /v1/responses/{id}/input_items: the items a response was given, as a
// list page (order "desc" by default, as OpenAI's; limit 1-100, after an id).
void HttpServer::Impl::handle_input_items(const httplib::Request& req, httplib::Response& res) {
  const char* endpoint = endpoint_name(Endpoint::Responses);
  const std::string id = req.matches[1].str();
  std::shared_ptr<const StoredResponse> stored = stored_responses.get(id, req.get_param_value("cache_salt"));
  if (!stored) return reply_error(res, response_not_found(id), "", endpoint);
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  if (order != "asc" && order != "desc")
    return reply_error(res, ApiError::invalid("order must be \"asc\" or \"desc\"", "order"), "", endpoint);
  size_t limit = 20;
  if (req.has_param("limit")) {
    const std::string v = req.get_param_value("limit");
    size_t parsed = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
    if (ec != std::errc() || end != v.data() + v.size() || parsed < 1 || parsed > 100)
      return reply_error(res, ApiError::invalid("limit must be an integer between 1 and 100", "limit"), "", endpoint);
    limit = parsed;
  }
  std::vector<ordered_json> items = ordered_json::parse(stored->input_items);
  if (order == "desc") std::reverse(items.begin(), items.end());
  size_t first = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    while (first < items.size() && items[first]["id"] != after) ++first;
    if (first == items.size())
      return reply_error(res, ApiError::invalid("after names no input item of this response", "after"), "", endpoint);
    ++first;
  }
  ordered_json data = ordered_json::array();
  for (size_t i = first; i < items.size() && data.size() < limit; ++i) data.push_back(items[i]);
  const bool more = first + data.size() < items.size();
  reply_json(res, 200, list_page(std::move(data), more));
  metrics.record_request("", endpoint, 200);
}

void HttpServer::Impl::start_generation(const httplib::Request& req, httplib::Response& res,
                                        std::shared_ptr<ModelLease> lease, std::vector<GenerationPlan> plans,
                                        ResponseContext context) {
  // The response's id, as OpenAI's x-request-id (the SDKs' request_id).
  res.set_header("x-request-id", context.meta.id);
  if (context.endpoint == Endpoint::Messages) res.set_header("request-id", context.meta.id);  // Anthropic's SDKs read it
  const size_t n = context.choices_per_prompt();
  std::vector<ChoiceRun> runs(plans.size() * n);
  for (ChoiceRun& run : runs) run.channel = std::make_shared<GenerationChannel>();
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    std::erase_if(live, [](const std::weak_ptr<GenerationChannel>& w) { return w.expired(); });
    for (const ChoiceRun& run : runs) live.push_back(run.channel);
  }
  if (stopping.load())
    for (const ChoiceRun& run : runs) run.channel->cancel();
  auto watch = std::make_shared<DisconnectMonitor::Watch>();
  if (auto fd = find_connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port))
    *watch = monitor.watch(*fd, [runs] {
      for (const ChoiceRun& run : runs) run.channel->cancel();
    });

  // Each choice is a generation of its own: its seed is the request's plus
  // its index among its prompt's choices (or random), and its prompt is its
  // prompt's, so the first of them to be prefilled computes it and the
  // others attach its blocks from the cache (InflightPrefixes makes them
  // wait for it rather than compute it too). The jobs share the lease: the
  // model stays loaded until the last ends. They are one scheduler group:
  // requests take free slots in turn, however many jobs each queued.
  const uint64_t group = next_job_group.fetch_add(1) + 1;
  for (size_t p = 0; p < plans.size(); ++p)
    for (size_t i = 0; i < n; ++i) {
      GenerationPlan choice_plan = i + 1 < n ? plans[p] : std::move(plans[p]);
      choice_plan.loras = context.options.loras;
      if (i > 0)
        choice_plan.sampling.seed = context.options.seed_given
                                        ? context.options.sampling.seed + static_cast<uint64_t>(i)
                                        : random_seed();
      ChoiceRun& run = runs[p * n + i];
      run.job = scheduler.submit([lease, plan = std::move(choice_plan), channel = run.channel]() mutable {
        GenerationOutcome outcome = run_generation(**lease, plan, *channel);
        lease.reset();
        channel->finish(std::move(outcome));
      }, group);
    }
  lease.reset();

  if (!context.options.stream) {
    if (context.builds_whole_reply()) reply_built(res, runs, context);
    else if (context.endpoint == Endpoint::Embeddings) reply_embeddings(res, runs, context);
    else reply_complete(res, runs, context);
    return;
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto in_flight_guard = std::make_shared<InFlight>(in_flight);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, runs, context, watch, in_flight_guard](size_t, httplib::DataSink& sink) {
        return context.builds_whole_reply() ? stream_built(sink, runs, context) : stream(sink, runs, context);
      },
      [runs, watch](bool) {
        // No-op when finished; stops generation when the response was abandoned.
        for (const ChoiceRun& run : runs) run.channel->cancel();
        watch->reset();
      });
}

void HttpServer::Impl::finish_metrics(const ResponseContext& ctx, std::span<const GenerationOutcome> outcomes,
                                      int status) {
  const std::string& model = ctx.meta.model;
  const char* endpoint = endpoint_name(ctx.endpoint);
  metrics.record_request(model, endpoint, status);
  // Token and time counters count what the server did: each choice's
  // sequence, with the prompt tokens it read from the cache.
  bool cancelled = false;
  for (const GenerationOutcome& o : outcomes) {
    metrics.record_tokens(model, o.usage.prompt_tokens, o.usage.cached_tokens, o.usage.completion_tokens);
    metrics.record_timing(model, o.queue_seconds, o.prefill_seconds, o.decode_seconds);
    cancelled |= o.finish_reason == "cancelled";
  }
  if (cancelled) metrics.record_cancelled(model);
  if (!options.log_requests) return;
  const UsageCounts usage = request_usage(outcomes, ctx.choices_per_prompt());
  const GenerationOutcome& first = outcomes.front();
  std::string finish;
  for (const GenerationOutcome& o : outcomes) {
    if (!finish.empty()) finish += ',';
    finish += o.error ? "error" : o.finish_reason;
  }
  char line[640];
  std::snprintf(line, sizeof line,
                "%s %d model=%s%s%s prompt=%lld cached=%lld completion=%lld finish=%s queue=%.0fms prefill=%.0fms "
                "decode=%.0fms",
                endpoint, status, model.c_str(), ctx.options.stream ? " stream" : "",
                outcomes.size() > 1 ? (" n=" + std::to_string(outcomes.size())).c_str() : "",
                static_cast<long long>(usage.prompt_tokens), static_cast<long long>(usage.cached_tokens),
                static_cast<long long>(usage.completion_tokens), finish.substr(0, 200).c_str(),
                first.queue_seconds * 1e3, first.prefill_seconds * 1e3, first.decode_seconds * 1e3);
  say(line);
}

namespace {
// Client closed the connection before the response was complete (nginx's code).
constexpr int kClientClosed = 499;
// How often a response's HTTP thread collects a generation's tokens
// (GenerationChannel::take's pace): a stream's events go out at most this
// long after their token (a few tokens a batch at a small model's speed,
// one at a large model's); a reply's end is not held back by it (the end
// wakes a paced take).
constexpr milliseconds kTakePace{5};

// The first error among a request's choices, or none.
const ApiError* first_error(std::span<const GenerationOutcome> outcomes) {
  for (const GenerationOutcome& o : outcomes)
    if (o.error) return &*o.error;
  return nullptr;
}

bool any_cancelled(std::span<const GenerationOutcome> outcomes) {
  return std::any_of(outcomes.begin(), outcomes.end(),
                     [](const GenerationOutcome& o) { return o.finish_reason == "cancelled"; });
}

// Takes what a request's choices generate until every one has finished:
// each round hands each choice's new deltas to add(i, deltas), a finished
// choice's outcome to finished(i, outcome), then calls round_done(). One
// choice is taken from with a paced wait; several are polled at that pace.
// A choice that fails cancels the others (the request fails as a whole, so
// their tokens would be thrown away). `leave_queue(run)` runs while waiting.
template <typename LeaveQueue, typename Add, typename Finished, typename RoundDone>
std::vector<GenerationOutcome> collect_choices(const std::vector<ChoiceRun>& runs, LeaveQueue leave_queue, Add add,
                                               Finished finished, RoundDone round_done) {
  const size_t n = runs.size();
  std::vector<GenerationOutcome> outcomes(n);
  std::vector<bool> done(n, false);
  size_t unfinished = n;
  std::vector<GenerationDelta> deltas;
  while (unfinished > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      const bool end = n == 1 ? runs[i].channel->take(deltas, milliseconds(200), kTakePace)
                              : runs[i].channel->take(deltas, milliseconds(0));
      if (!end) leave_queue(runs[i]);
      add(i, deltas);
      deltas.clear();
      if (!end) continue;
      done[i] = true;
      --unfinished;
      outcomes[i] = runs[i].channel->outcome();
      if (outcomes[i].error)
        for (const ChoiceRun& run : runs) run.channel->cancel();
      finished(i, outcomes[i]);
    }
    round_done();
    if (n > 1 && unfinished > 0) std::this_thread::sleep_for(kTakePace);
  }
  return outcomes;
}

// A finished chat choice of a complete (not streamed) reply: its text, or
// the tool calls read out of it.
ordered_json chat_reply_choice_json(const ResponseContext& ctx, int index, const std::string& text,
                                    const std::string& finish_reason,
                                    const std::optional<std::vector<LogprobEntry>>& lp, const std::string& reasoning) {
  if (ctx.options.tool_call_reply && finish_reason == "stop")
    if (const std::optional<ToolCall> call = forced_tool_call(text, ctx.id_syntax))
      return chat_tool_call_choice_json(index, "", {*call}, lp);
  if (ctx.tool_syntax != ToolCallSyntax::None && finish_reason == "stop")
    if (auto parsed = parse_tool_calls(ctx.tool_syntax, text, ctx.tool_names)) {
      limit_calls(parsed->calls, ctx);
      return chat_tool_call_choice_json(index, parsed->content(), parsed->calls, lp, reasoning);
    }
  return chat_choice_json(index, text, finish_reason, lp, reasoning);
}

}  // namespace

void HttpServer::Impl::reply_complete(httplib::Response& res, const std::vector<ChoiceRun>& runs,
                                      const ResponseContext& ctx) {
  const bool chat = ctx.endpoint == Endpoint::Chat;
  const size_t n = runs.size();
  std::vector<std::string> texts(n);
  std::vector<std::vector<LogprobEntry>> logprobs(n);  // chat
  // Text completions: built delta by delta, each delta's tokens' offsets
  // counted from where its text starts, as a stream counts them.
  std::vector<ordered_json> completion_logprobs(n);
  std::vector<size_t> characters(n, 0);
  const std::vector<GenerationOutcome> outcomes = collect_choices(
      runs, [this](const ChoiceRun& run) { leave_queue_if_cancelled(run); },
      [&](size_t i, std::vector<GenerationDelta>& deltas) {
        for (GenerationDelta& d : deltas) {
          texts[i] += d.text;
          if (!ctx.options.logprobs) continue;
          if (chat) {
            for (LogprobEntry& e : d.logprobs) logprobs[i].push_back(std::move(e));
          } else {
            append_completion_logprobs(completion_logprobs[i], d.logprobs, characters[i]);
            characters[i] += utf8_characters(d.text);
          }
        }
      },
      [](size_t, const GenerationOutcome&) {}, [] {});
  if (reply_failure(res, outcomes, ctx)) return;
  ordered_json choices = ordered_json::array();
  for (size_t i = 0; i < n; ++i) {
    const int index = static_cast<int>(i);
    if (!chat) {
      if (ctx.options.logprobs && completion_logprobs[i].is_null()) append_completion_logprobs(completion_logprobs[i], {}, 0);
      choices.push_back(
          completion_choice_json(index, texts[i], outcomes[i].finish_reason, std::move(completion_logprobs[i])));
      continue;
    }
    std::optional<std::vector<LogprobEntry>> lp;
    if (ctx.options.logprobs) lp = std::move(logprobs[i]);
    if (ctx.harmony) {
      HarmonyStream harmony(ctx.harmony_calls);
      HarmonyStream::Parts parts = harmony.push(texts[i]);
      HarmonyStream::Parts rest = harmony.flush(outcomes[i].finish_reason == "stop");
      const std::string content = parts.content + rest.content, reasoning = parts.reasoning + rest.reasoning;
      std::vector<ToolCall> calls = harmony.calls();
      limit_calls(calls, ctx);
      for (ToolCall& call : calls) call.id = make_tool_call_id(ctx.id_syntax);
      if (!calls.empty())
        choices.push_back(chat_tool_call_choice_json(index, content, calls, lp, reasoning));
      else
        choices.push_back(chat_choice_json(index, content, outcomes[i].finish_reason, lp, reasoning));
      continue;
    }
    std::string reasoning;
    if (ctx.split_reasoning) {
      ReasoningSplitter splitter(ctx.opens_reasoning);
      ReasoningSplitter::Parts parts = splitter.push(texts[i]);
      ReasoningSplitter::Parts rest = splitter.flush();
      texts[i] = parts.content + rest.content;
      reasoning = parts.reasoning + rest.reasoning;
    }
    choices.push_back(chat_reply_choice_json(ctx, index, texts[i], outcomes[i].finish_reason, lp, reasoning));
  }
  const UsageCounts usage = request_usage(outcomes, ctx.choices_per_prompt());
  reply_json(res, 200,
             chat ? chat_completion_json(ctx.meta, std::move(choices), usage)
                                            : completion_json(ctx.meta, std::move(choices), usage));
  finish_metrics(ctx, outcomes, 200);
}

namespace {

// A streamed response's writes: once one fails (the client is gone), the
// request's generations are cancelled and later writes are dropped.
class ClientStream {
 public:
  ClientStream(httplib::DataSink& sink, const std::vector<ChoiceRun>& runs) : sink_(sink), runs_(runs) {}

  bool write(const std::string& data) {
    if (ok_ && !data.empty() && !sink_.write(data.data(), data.size())) {
      ok_ = false;
      for (const ChoiceRun& run : runs_) run.channel->cancel();  // stop generating for a client that left
    }
    return ok_;
  }
  // Writes what `pending` holds, then empties it.
  void flush(std::string& pending) {
    write(pending);
    pending.clear();
  }
  bool ok() const { return ok_; }

 private:
  httplib::DataSink& sink_;
  const std::vector<ChoiceRun>& runs_;
  bool ok_ = true;
};

}  // namespace

// A complete (not streamed) reply that failed, was cancelled or was cut
// short by shutdown: answered with its error. False when it succeeded.
bool HttpServer::Impl::reply_failure(httplib::Response& res, std::span<const GenerationOutcome> outcomes,
                                     const ResponseContext& ctx) {
  if (const ApiError* error = first_error(outcomes)) {
    reply_json(res, error->status, error_body(*error, endpoint_name(ctx.endpoint)));
    finish_metrics(ctx, outcomes, error->status);
    return true;
  }
  if (any_cancelled(outcomes) && stopping.load()) {
    // Cancelled by the server's shutdown, not by the client: retryable.
    reply_json(res, 503, error_body(shutting_down_error(), endpoint_name(ctx.endpoint)));
    finish_metrics(ctx, outcomes, 503);
    return true;
  }
  if (any_cancelled(outcomes)) {
    reply_json(res, kClientClosed,
               error_body(ApiError{kClientClosed, "request cancelled", "invalid_request_error", {}, "cancelled"},
                          endpoint_name(ctx.endpoint)));
    finish_metrics(ctx, outcomes, kClientClosed);
    return true;
  }
  return false;
}

// Embeddings: one unit-length vector per input, in input order.
void HttpServer::Impl::reply_embeddings(httplib::Response& res, const std::vector<ChoiceRun>& runs,
                                        const ResponseContext& ctx) {
  const std::vector<GenerationOutcome> outcomes = collect_choices(
      runs, [this](const ChoiceRun& run) { leave_queue_if_cancelled(run); },
      [](size_t, std::vector<GenerationDelta>&) {}, [](size_t, const GenerationOutcome&) {}, [] {});
  if (reply_failure(res, outcomes, ctx)) return;
  ordered_json data = ordered_json::array();
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const std::vector<float>& v = outcomes[i].embedding;
    ordered_json values;
    if (ctx.embeddings_base64) {
      values = base64_floats(v);
    } else {
      // Each float as the shortest decimal that reads back as it, not as
      // its 17-digit double (the nearest double to that decimal prints as it).
      values = ordered_json::array();
      for (float x : v) {
        char digits[32];
        const auto end = std::to_chars(digits, digits + sizeof digits - 1, x).ptr;
        *end = '\0';
        values.push_back(std::strtod(digits, nullptr));
      }
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(values)}});
  }
  const UsageCounts usage = request_usage(outcomes, 1);
  reply_json(res, 200,
             {{"object", "list"},
              {"data", std::move(data)},
              {"model", ctx.meta.model},
              {"usage",
               {{"prompt_tokens", usage.prompt_tokens},
                {"total_tokens", usage.prompt_tokens},
                {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}}}});
  finish_metrics(ctx, outcomes, 200);
}

// The builder of a whole reply for the endpoint (Responses, Messages),
// with what follows its completion (a Response is stored); `events` null
// when not streamed.
HttpServer::Impl::BuiltReply HttpServer::Impl::reply_builder(const ResponseContext& ctx, std::string* events) {
  if (ctx.endpoint == Endpoint::Messages)
    return {std::make_unique<MessageBuilder>(ctx.meta.id, ctx.meta.model, ctx.prompt_tokens, ctx.options.stop, events),
            [](const ordered_json&) {}};
  auto builder = std::make_unique<ResponseBuilder>(response_shell(ctx), events);
  const ResponseBuilder* response = builder.get();
  return {std::move(builder), [this, &ctx, response](const ordered_json& reply) { store_response(ctx, *response, reply); }};
}

// A Responses or Messages reply, not streamed: the choice is read as a
// stream is (the same reasoning split and tool-call reading), into one
// object.
void HttpServer::Impl::reply_built(httplib::Response& res, const std::vector<ChoiceRun>& runs,
                                   const ResponseContext& ctx) {
  const BuiltReply built = reply_builder(ctx, nullptr);
  ReplyBuilder& builder = *built.builder;
  ChoiceStream reader(ctx, builder);
  const std::vector<GenerationOutcome> outcomes = collect_choices(
      runs, [this](const ChoiceRun& run) { leave_queue_if_cancelled(run); },
      [&](size_t, std::vector<GenerationDelta>& deltas) { reader.add(deltas); },
      [&](size_t, const GenerationOutcome& outcome) {
        if (!outcome.error && outcome.finish_reason != "cancelled") reader.finish(outcome.finish_reason);
      },
      [] {});
  if (reply_failure(res, outcomes, ctx)) return;
  const ordered_json reply = builder.complete(outcomes.front(), reader.reasoning_tokens());
  built.completed(reply);
  reply_json(res, 200, reply);
  finish_metrics(ctx, outcomes, 200);
}

// A Responses or Messages stream: its API's typed events, no [DONE]. A
// failure after the headers went out is the API's failure event.
bool HttpServer::Impl::stream_built(httplib::DataSink& sink, const std::vector<ChoiceRun>& runs,
                                    const ResponseContext& ctx) {
  ClientStream client(sink, runs);
  std::string events;
  const BuiltReply built = reply_builder(ctx, &events);
  ReplyBuilder& builder = *built.builder;
  ChoiceStream reader(ctx, builder);
  builder.start();
  client.flush(events);
  const std::vector<GenerationOutcome> outcomes = collect_choices(
      runs, [this](const ChoiceRun& run) { leave_queue_if_cancelled(run); },
      [&](size_t, std::vector<GenerationDelta>& deltas) {
        if (client.ok()) reader.add(deltas);
      },
      [&](size_t, const GenerationOutcome& outcome) {
        if (client.ok() && !outcome.error && outcome.finish_reason != "cancelled") reader.finish(outcome.finish_reason);
      },
      [&] { client.flush(events); });
  int status = 200;
  if (client.ok() && any_cancelled(outcomes) && stopping.load()) {
    builder.fail(shutting_down_error());
    status = 503;
  } else if (const ApiError* error = first_error(outcomes); error && client.ok()) {
    builder.fail(*error);
    status = error->status;
  } else if (!client.ok() || any_cancelled(outcomes)) {
    finish_metrics(ctx, outcomes, kClientClosed);
    return false;
  } else {
    built.completed(builder.complete(outcomes.front(), reader.reasoning_tokens()));
  }
  client.flush(events);
  finish_metrics(ctx, outcomes, client.ok() ? status : kClientClosed);
  if (!client.ok()) return false;
  sink.done();
  return true;
}

// A finished Response kept for GET and previous_response_id (store: true):
// its turn as chat messages, the input, then the reply.
void HttpServer::Impl::store_response(const ResponseContext& ctx, const ResponseBuilder& builder,
                                      const ordered_json& response) {
  if (!ctx.responses->store) return;
  const ResponsesRequest& request = *ctx.responses;
  ordered_json messages = request.input_messages;
  messages.push_back(builder.assistant_message());
  StoredResponse stored;
  stored.id = ctx.meta.id;
  stored.cache_salt = request.cache_salt;
  stored.previous_response_id = request.previous_response_id;
  stored.response = dump_json(response);
  stored.input_items = dump_json(request.input_items);
  stored.messages = dump_json(messages);
  if (!stored_responses.put(std::move(stored)))
    say("response " + ctx.meta.id + " is larger than --responses-ram and was not stored");
}

bool HttpServer::Impl::stream(httplib::DataSink& sink, const std::vector<ChoiceRun>& runs,
                              const ResponseContext& ctx) {
  const bool chat = ctx.endpoint == Endpoint::Chat;
  const size_t n = runs.size();
  ClientStream client(sink, runs);

  std::string events;  // one write per round of takes: a token's event each
  std::vector<std::unique_ptr<ChoiceEvents>> chunks;
  std::vector<ChoiceStream> choices;
  choices.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    chunks.push_back(make_chunk_events(ctx, static_cast<int>(i), events));
    choices.emplace_back(ctx, *chunks.back());
    if (chat)
      events += sse_event(chat_chunk_json(ctx.meta, {{"role", "assistant"}, {"content", ""}}, "", std::nullopt,
                                          ctx.options.include_usage, static_cast<int>(i)));
  }
  client.flush(events);
  // Runs until every generation finishes, even after a failed write: a
  // cancelled generation stops within a token, and its counts belong in the
  // metrics.
  const std::vector<GenerationOutcome> outcomes = collect_choices(
      runs, [this](const ChoiceRun& run) { leave_queue_if_cancelled(run); },
      [&](size_t i, std::vector<GenerationDelta>& deltas) {
        if (!client.ok()) return;  // the client is gone: only the end is waited for
        choices[i].add(deltas);
      },
      [&](size_t i, const GenerationOutcome& outcome) {
        if (!outcome.error && outcome.finish_reason != "cancelled") choices[i].finish(outcome.finish_reason);
      },
      [&] {
        client.flush(events);
      });
  if (client.ok() && any_cancelled(outcomes) && stopping.load()) {
    // Cut short by the server's shutdown: the client learns why, and that
    // the stream is over, instead of seeing it end mid-reply; the chunked
    // body is ended properly (HTTP clients otherwise report a truncated
    // response instead of the event).
    client.write(sse_event(error_json(shutting_down_error())));
    client.write(sse_done());
    finish_metrics(ctx, outcomes, 503);
    if (!client.ok()) return false;
    sink.done();
    return true;
  }
  const ApiError* error = first_error(outcomes);
  if (!client.ok() || (!error && any_cancelled(outcomes))) {
    finish_metrics(ctx, outcomes, kClientClosed);
    return false;
  }
  if (error) {
    // Headers (200) are already sent: report the error as an event, as OpenAI does.
    client.write(sse_event(error_json(*error)));
  } else if (ctx.options.include_usage) {
    const UsageCounts usage = request_usage(outcomes, ctx.choices_per_prompt());
    client.write(sse_event(chat ? chat_usage_chunk_json(ctx.meta, usage) : completion_usage_chunk_json(ctx.meta, usage)));
  }
  client.write(sse_done());
  finish_metrics(ctx, outcomes, !client.ok() ? kClientClosed : error ? error->status : 200);
  if (!client.ok()) return false;
  sink.done();
  return true;
}

HttpServer::HttpServer(const ServeOptions& options, ModelRegistry& registry, Log log)
    : impl_(std::make_unique<Impl>(options, registry, std::move(log))) {
  if (auto err = options.validate(); !err.empty()) throw Error(err);
  std::signal(SIGPIPE, SIG_IGN);
  impl_->setup();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  const ServeOptions& o = impl_->options;
  int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0)
    throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (is another server using the port?)");
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of clients
  // connecting at once waited a SYN retransmission (~1 s) each beyond it.
  // Listening again on the bound socket only raises the backlog.
  if (impl_->listen_socket != INVALID_SOCKET) ::listen(impl_->listen_socket, SOMAXCONN);
  impl_->bound_port = port;
  return port;
}

void HttpServer::serve() {
  if (impl_->bound_port < 0) throw Error("HttpServer::serve() before bind()");
  if (impl_->stopping.load()) return;
  impl_->serving.store(true);
  impl_->http.listen_after_bind();
  impl_->serving.store(false);
}

void HttpServer::stop() {
  impl_->stopping.store(true);
  {
    std::lock_guard<std::mutex> lock(impl_->live_mutex);
    for (const auto& w : impl_->live)
      if (auto channel = w.lock()) channel->cancel();
  }
  // cpp-httplib's stop() does nothing until its accept loop is running; a
  // stop() racing a serve() that is just starting waits for that moment.
  for (int i = 0; i < 200 && impl_->serving.load() && !impl_->http.is_running(); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  impl_->http.stop();
}

}  // namespace reprise
