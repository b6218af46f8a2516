// The OpenAI-compatible HTTP server: routes, API-key check, body limit,
// streaming, and the glue from requests to the registry and scheduler.
//
// Threads: cpp-httplib runs each connection on a pool thread (sized well
// above --parallel so idle keep-alive or stalled clients cannot starve
// /health or /metrics); generation runs on the scheduler's --parallel slots;
// a monitor thread cancels generations whose client hung up.
//
// Constructing a server ignores SIGPIPE process-wide: cpp-httplib writes
// with plain send(), and a client closing its socket must not kill the
// process.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "server/model_registry.h"
#include "server/serve_options.h"

namespace reprise {

class HttpServer {
 public:
  using Log = std::function<void(const std::string&)>;
  // The registry must outlive the server.
  HttpServer(const ServeOptions& options, ModelRegistry& registry, Log log = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds options.host:options.port (0 = ephemeral) and returns the port.
  // Throws reprise::Error when the address cannot be bound.
  int bind();
  // Serves until stop(); call after bind().
  void serve();
  // Thread-safe. Cancels running generations and makes serve() return.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace reprise
