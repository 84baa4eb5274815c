// The OpenAI-compatible HTTP server (cpp-httplib, header-only, no TLS). It starts listening
// before the model is loaded (/health answers during loading); attach() hands it the engine.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "server/metrics.h"
#include "server/model_names.h"
#include "server/validate.h"
#include "tokenizer/tokenizer.h"

namespace httplib { class Server; }

namespace mx::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;               // empty = no auth
  ModelNames model;                  // set by the CLI: the name responses carry and the others a request may give
  size_t max_body_bytes = 2u << 20;
  double request_timeout_s = 600;
  // HTTP worker threads. A streaming or queued request holds one for its whole life, so the server
  // needs about max_num_seqs + max_waiting of them; 0 = cpp-httplib's default (max(8, cores - 1)),
  // which would cap concurrent generations at that number.
  int http_threads = 0;
  Limits limits;
  // Tests only: a request's consumer throws when it reaches this many generated tokens (0 = never),
  // to check that a fault while generating ends that request alone.
  int fault_after_tokens = 0;
};

class Server {
 public:
  explicit Server(const ServerOptions& opt);
  ~Server();
  // Must be called at most once, before or while listen() runs.
  void attach(runtime::Engine* engine, std::shared_ptr<const Tokenizer> tok, std::vector<int32_t> eos_ids);
  bool bind();              // binds host:port; false on failure
  void listen();            // blocks until stop()
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace mx::server
