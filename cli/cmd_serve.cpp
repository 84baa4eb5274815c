#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/device.h"
#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "model/cpu_runner.h"
#include "model/fixture.h"
#include "runtime/engine.h"
#include "runtime/speculative_config.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace mx::cli {
namespace {

struct ServeOptions {
  std::string model_dir;
  server::ServerOptions srv;
  int max_model_len = 0;
  int max_num_seqs = 0;  // 0 = by GPU (default_max_num_seqs); docs/perf.md sessions 22, 28 and 42 have the load runs
  int max_num_batched_tokens = 8192;
  int max_waiting = 256;
  int max_prefill_tokens_with_decodes = 2048;  // runtime::EngineOptions
  double gpu_memory_utilization = 0.9;
  FormatFlags formats;  // --kv-cache-dtype, --mxfp4-layers, --fp8-layers
  TensorParallel tp;    // --tensor-parallel-size, ...
  std::string device = "auto";
  int threads = 0;
  int kv_tokens = 16384;
  double drain_timeout_s = 30;
  bool enable_prefix_caching = true;
  bool decode_ahead = true;
  std::string dummy_weights;  // preset served with random GPU-made weights (benchmarks)
  std::vector<std::string> served_names;  // --served-model-name (server::ModelNames)
  std::string speculative_config;         // vLLM's JSON (runtime/speculative_config.h); empty = off
};

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal.store(sig); }

std::string demo_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path base = xdg && *xdg ? xdg : (home && *home ? std::filesystem::path(home) / ".cache" : std::filesystem::temp_directory_path());
  std::filesystem::path dir = base / "mxserve" / "demo-tiny";
  if (!std::filesystem::exists(dir / "config.json") || !std::filesystem::exists(dir / "model.safetensors.index.json")) {
    log::info("writing the tiny demo model to {}", dir.string());
    std::filesystem::create_directories(dir);
    FixtureOptions fo;
    fo.preset = "tiny";
    fo.out_dir = dir.string();
    write_fixture(fo);
  }
  return dir.string();
}

// The runner for the chosen device, and the most tokens one sequence's KV may hold in it.
struct LoadedRunner {
  std::unique_ptr<ModelRunner> runner;
  int kv_capacity_tokens = 0;
  const char* capacity_flag = "";  // what to change when --max-model-len does not fit
};

LoadedRunner load_runner(const ServeOptions& o, const Formats& fmt, Device dev, int vocab_limit) {
  if (dev == Device::kCpu) {
    CpuRunnerOptions ro;
    ro.model_dir = o.model_dir;
    ro.num_threads = o.threads;
    ro.kv_tokens = o.kv_tokens;
    ro.kv_fp8 = fmt.kv_fp8;
    ro.dense = fmt.dense;
    ro.vocab_limit = vocab_limit;
    auto runner = std::make_unique<CpuRunner>(ro);
    const int cap = max_sequence_tokens(runner->kv_shape(), o.max_num_batched_tokens);
    return {std::move(runner), cap, "--kv-tokens"};
  }
  // The engine's KV cache is sized for max_model_len up front (0 = the model's positions; a GPU
  // that cannot hold that fails at load with the numbers, like vLLM).
  const ModelConfig cfg = o.dummy_weights.empty() ? load_model_config(o.model_dir) : preset_config(o.dummy_weights);
  const int max_model_len = o.max_model_len > 0 ? o.max_model_len : cfg.max_position_embeddings;
  auto runner = make_cuda_model_runner({.model_dir = o.model_dir, .gpu_memory_utilization = float(o.gpu_memory_utilization),
                                        .max_model_len = max_model_len, .max_num_seqs = o.max_num_seqs,
                                        .max_tokens_per_step = o.max_num_batched_tokens,
                                        .vocab_limit = vocab_limit, .dummy_preset = o.dummy_weights,
                                        .decode_ahead = o.decode_ahead, .kv_fp8 = fmt.kv_fp8,
                                        .dense = fmt.dense, .tp = o.tp});
  const KvCacheShape kv = runner->kv_shape();
  return {std::move(runner), std::min(max_model_len, max_sequence_tokens(kv, o.max_num_batched_tokens)),
          "--gpu-memory-utilization"};
}

void run_serve(ServeOptions o) {
  const Device dev = resolve_device(o.device);
  const Formats fmt = resolve_formats(o.formats);
  check_parallel(o.tp, dev);
  if (o.max_num_seqs == 0) o.max_num_seqs = default_max_num_seqs(dev);
  if (!o.dummy_weights.empty()) {
    if (dev != Device::kCuda) fail("--dummy-weights needs the CUDA engine (--device cuda)");
    if (!o.model_dir.empty()) fail("--dummy-weights and --model are exclusive");
    o.model_dir = demo_model_dir();  // for the tokenizer only: the weights are made on the GPU
    log::warn("--dummy-weights {}: RANDOM weights at the real shapes, for benchmarks; answers are random text",
              o.dummy_weights);
    if (o.served_names.empty()) o.served_names = {"dummy-" + o.dummy_weights};
  } else if (o.model_dir.empty()) {
    o.model_dir = demo_model_dir();
    log::warn("no --model given: serving the tiny demo model with RANDOM weights; answers are random text");
    if (o.served_names.empty()) o.served_names = {"mxserve-demo-tiny"};
  }
  if (o.served_names.empty()) {
    o.srv.model = server::default_model_names(o.model_dir);
  } else {
    o.srv.model.primary = o.served_names[0];
    o.srv.model.aliases.assign(o.served_names.begin() + 1, o.served_names.end());
  }

  if (o.tp.node_rank > 0) {  // a node other than 0 serves nothing: its GPUs run node 0's steps
    auto tok = Tokenizer::load(o.model_dir + "/tokenizer.json");
    LoadedRunner loaded = load_runner(o, fmt, dev, tok->vocab_size());
    log::info("node {} of {}: running node 0's steps ({}:{})", o.tp.node_rank, o.tp.nnodes, o.tp.master_addr,
              o.tp.master_port);
    run_node_steps(*loaded.runner);
    log::info("node 0 ended the group; exiting");
    return;
  }
  // Every running or queued request holds an HTTP thread; a few more keep /health and /metrics live.
  // The queue's share is capped at 4096 (a large --max-waiting): requests past it wait in the accept queue.
  o.srv.http_threads = o.max_num_seqs + std::min(o.max_waiting, 4096) + 8;
  server::Server srv(o.srv);
  if (!srv.bind()) fail("cannot listen on {}:{} (in use or not permitted)", o.srv.host, o.srv.port);
  std::string names;
  for (const std::string& n : o.srv.model.all()) names += (names.empty() ? "'" : ", '") + n + "'";
  log::info("listening on http://{}:{} (model {})", o.srv.host, srv.port(), names);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::thread http([&] { srv.listen(); });

  // Load in the background of the running HTTP server: /health answers meanwhile.
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<runtime::Engine> engine;
  std::shared_ptr<const Tokenizer> tok;
  try {
    log::info("loading tokenizer and weights from {} (device {})", o.model_dir, device_name(dev));
    tok = Tokenizer::load(o.model_dir + "/tokenizer.json");
    LoadedRunner loaded = load_runner(o, fmt, dev, tok->vocab_size());
    runner = std::move(loaded.runner);
    runtime::EngineOptions eo{.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.max_num_batched_tokens,
                              .max_waiting = o.max_waiting,
                              .max_prefill_tokens_with_decodes = o.max_prefill_tokens_with_decodes,
                              .max_model_len = o.max_model_len,
                              .enable_prefix_caching = o.enable_prefix_caching};
    if (!o.speculative_config.empty()) {
      runtime::parse_speculative_config(o.speculative_config, eo);
      log::info("n-gram speculation: up to {} drafts, n-grams of {}-{} tokens, while at most {} sequences run", eo.spec_tokens,
                eo.spec_ngram_min, eo.spec_ngram_max, eo.spec_max_running);
    }
    const ModelConfig& cfg = runner->config();
    if (eo.max_model_len > cfg.max_position_embeddings)
      fail("--max-model-len {} exceeds the model's {} positions", eo.max_model_len, cfg.max_position_embeddings);
    // A request longer than the whole KV pool could never run: cap the context to it.
    if (eo.max_model_len == 0) eo.max_model_len = std::min(cfg.max_position_embeddings, loaded.kv_capacity_tokens);
    if (eo.max_model_len > loaded.kv_capacity_tokens)
      fail("--max-model-len {} exceeds the KV capacity of {} tokens ({})", eo.max_model_len, loaded.kv_capacity_tokens,
           loaded.capacity_flag);
    engine = std::make_unique<runtime::Engine>(*runner, eo);
    engine->start();
    srv.attach(engine.get(), tok, cfg.eos_token_ids);
    log::info("model loaded on {}: {} layers, max_model_len {}, max_num_seqs {}, KV {} blocks x {} tokens ({} tokens, {}), prefix "
              "caching {}, dense layers {}{}",
              device_name(dev), cfg.num_layers, engine->max_model_len(), o.max_num_seqs, runner->kv_shape().num_blocks,
              runner->kv_shape().block_size, int64_t(runner->kv_shape().num_blocks) * runner->kv_shape().block_size,
              fmt.kv_fp8 ? "fp8 e4m3" : dev == Device::kCuda ? "bf16" : "fp32",
              o.enable_prefix_caching ? "on" : "off", fmt.dense.describe(),
              dev != Device::kCuda ? ""
              : o.tp.size == 1 ? ", 1 GPU"
                               : fmt::format(", {} GPUs (tensor parallel: each holds its KV heads of every block)", o.tp.size));
  } catch (...) {
    srv.stop();
    http.join();
    throw;
  }
  while (g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  log::info("signal {}: draining (up to {} s)", g_signal.load(), o.drain_timeout_s);
  engine->drain_and_stop(std::chrono::milliseconds(int64_t(o.drain_timeout_s * 1000)));
  // Give streaming handlers a moment to write their final chunks before closing sockets.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  srv.stop();
  http.join();
  log::info("shut down");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  cmd->add_option("--model", o->model_dir, "model directory (HF layout); none = tiny random demo model");
  cmd->add_option("--host", o->srv.host)->capture_default_str();
  cmd->add_option("--port", o->srv.port, "0 = any free port")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->srv.api_key, "require 'Authorization: Bearer KEY' on every route but /health, /ping and /version");
  cmd->add_option("--served-model-name", o->served_names,
                  "names a request's model may give; the first is the one listed first and in responses (default: the "
                  "directory's name; a Hugging Face cache snapshot's Hub id; gpt-oss-120b / -20b also answer to openai/NAME)");
  cmd->add_option("--max-model-len", o->max_model_len, "0 = the model's")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "0 = by GPU: on the CUDA engine 1024 with >= 120 GiB, 512 with >= 70 GiB, else 256")
      ->capture_default_str()
      ->check(CLI::Range(0, 16384));
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens)->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-waiting", o->max_waiting, "queued requests beyond this get 429")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-prefill-tokens-with-decodes", o->max_prefill_tokens_with_decodes,
                  "prompt tokens a step takes while streams decode (0 = all of --max-num-batched-tokens)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "(CUDA only)")->capture_default_str()->check(CLI::Range(0.05, 1.0));
  add_format_flags(cmd, &o->formats);
  add_parallel_flags(cmd, &o->tp);
  cmd->add_option("--kv-tokens", o->kv_tokens, "CPU: KV capacity in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 24));
  cmd->add_option("--dummy-weights", o->dummy_weights, "serve random weights at a preset's shapes (20b|120b; CUDA, benchmarks)")
      ->check(CLI::IsMember({"20b", "120b"}));
  cmd->add_option("--device", o->device, "auto|cpu|cuda (auto = cuda when built with it and a GPU is visible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout", o->srv.request_timeout_s, "seconds")->capture_default_str()->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--drain-timeout", o->drain_timeout_s, "seconds to finish in-flight requests on SIGTERM")->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--decode-ahead,!--no-decode-ahead", o->decode_ahead,
                "(CUDA, default on) enqueue a decoding batch's next step before its results are read; a step "
                "nobody then asks for (a stop token, a new request) is wasted work");
  cmd->add_option("--speculative-config", o->speculative_config,
                  "vLLM's JSON, n-gram only: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
                  "\"prompt_lookup_min\": 2, \"disable_by_batch_size\": 8} (greedy requests without log-probs or logit "
                  "adjustments; off by default)");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                "reuse the KV of cached prompt prefixes across requests (default on)");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace mx::cli
