#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>

#include "cli/commands.h"
#include "cli/device.h"
#include "core/error.h"
#include "core/log.h"
#include "harmony/harmony.h"
#include "model/cpu_runner.h"
#include "tokenizer/tokenizer.h"

namespace mx::cli {
namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  bool chat = false;
  int max_tokens = 64;
  SamplingParams sampling{.temperature = 1.0f};
  std::string device = "auto";
  float gpu_memory_utilization = 0.9f;
  int threads = 0;
  FormatFlags formats;  // --kv-cache-dtype, --mxfp4-layers, --fp8-layers
  TensorParallel tp;    // --tensor-parallel-size, ...
};

// The CUDA engine takes a prompt in chunks of at most this many tokens per step.
constexpr int kCudaPrefillChunk = 2048;

// One sequence: its KV cache only needs the prompt and the generated tokens, twice over when the
// sliding-window layers keep all of them in blocks of their own (contiguous_kv_tables).
std::unique_ptr<ModelRunner> make_runner(const GenerateOptions& o, const Formats& fmt, Device dev, int total_tokens,
                                         int vocab_limit) {
  const int blocks = (total_tokens + 15) / 16;
  if (dev == Device::kCuda)
    return make_cuda_model_runner({.model_dir = o.model_dir, .gpu_memory_utilization = o.gpu_memory_utilization,
                                   .max_model_len = blocks * kCudaBlockSize, .max_num_seqs = 1,
                                   .max_tokens_per_step = kCudaPrefillChunk, .num_kv_blocks = 2 * blocks,
                                   .vocab_limit = vocab_limit, .dummy_preset = {},
                                   .kv_fp8 = fmt.kv_fp8, .dense = fmt.dense, .tp = o.tp});
  CpuRunnerOptions ro;
  ro.model_dir = o.model_dir;
  ro.num_threads = o.threads;
  ro.kv_block_size = 16;
  ro.kv_tokens = 2 * blocks * 16;
  ro.vocab_limit = vocab_limit;
  ro.kv_fp8 = fmt.kv_fp8;
  ro.dense = fmt.dense;
  return std::make_unique<CpuRunner>(ro);
}

void run_generate(const GenerateOptions& o) {
  const Device dev = resolve_device(o.device);
  const Formats fmt = resolve_formats(o.formats);
  check_parallel(o.tp, dev);
  log::info("generate: device {}", device_name(dev));
  auto tok = Tokenizer::load(o.model_dir + "/tokenizer.json");
  std::vector<int32_t> prompt, stops;
  if (o.chat) {
    harmony::ChatRequest req;
    harmony::Message& m = req.messages.emplace_back();
    m.role = "user";
    m.content = o.prompt;
    prompt = harmony::render_chat(req, *tok).tokens;
    stops = harmony::stop_token_ids(*tok);  // <|return|>, <|call|>
  } else {
    prompt = tok->encode(o.prompt, /*allow_special=*/false);
  }
  if (prompt.empty()) fail("the prompt is empty");

  std::unique_ptr<ModelRunner> runner_ptr = make_runner(o, fmt, dev, int(prompt.size()) + o.max_tokens, tok->vocab_size());
  if (o.tp.node_rank > 0) {  // started with node 0's flags: its GPUs run node 0's steps
    run_node_steps(*runner_ptr);
    return;
  }
  ModelRunner& runner = *runner_ptr;
  const ModelConfig& cfg = runner.config();
  if (!o.chat) stops = cfg.eos_token_ids;
  if (int(prompt.size()) + o.max_tokens > cfg.max_position_embeddings)
    fail("prompt ({} tokens) + max tokens ({}) exceed the model's {} positions", prompt.size(), o.max_tokens,
         cfg.max_position_embeddings);

  KvTables tables;
  contiguous_kv_tables(runner.kv_shape(), 0, runner.kv_shape().num_blocks / 2, tables);
  IncrementalDecoder dec(tok);
  SampleResult res[1];
  SeqStep s{.seq_id = 0, .tokens = prompt, .start_pos = 0, .block_table = tables.full, .sliding_table = tables.sliding,
            .sample = true, .sampling = o.sampling};

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  // The CPU runner takes the whole prompt in one step; the CUDA engine in bounded chunks, sampling
  // only after the last one.
  const size_t chunk = dev == Device::kCuda ? kCudaPrefillChunk : prompt.size();
  for (size_t off = 0; off < prompt.size(); off += chunk) {
    const size_t n = std::min(chunk, prompt.size() - off);
    s.tokens = std::span<const int32_t>(prompt).subspan(off, n);
    s.start_pos = int(off);
    s.sample = off + n == prompt.size();
    runner.step({&s, 1}, res);
  }
  auto t1 = clock::now();
  int generated = 0;
  int32_t next = res[0].token;
  for (;;) {
    ++generated;
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    std::string text = dec.push(next);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (generated >= o.max_tokens) break;
    s.tokens = {&next, 1};
    s.start_pos = int(prompt.size()) + generated - 1;
    s.rng_step = uint64_t(generated);
    s.expect_next = generated + 1 < o.max_tokens;
    runner.step({&s, 1}, res);
    next = res[0].token;
  }
  std::string tail = dec.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::printf("\n");
  auto t2 = clock::now();
  double pre = std::chrono::duration<double>(t1 - t0).count(), dec_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prompt %zu tokens, %.1f tok/s; generated %d tokens, %.1f tok/s (device %s)\n", prompt.size(),
               prompt.size() / pre, generated, generated > 1 ? (generated - 1) / dec_s : 0.0, device_name(dev));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("--model", o->model_dir, "model directory (HF layout)")->required();
  cmd->add_option("--prompt", o->prompt, "prompt text")->required();
  cmd->add_flag("--chat", o->chat, "render the prompt as a user message in harmony format");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", o->sampling.top_p)->capture_default_str()->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--top-k", o->sampling.top_k)->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--min-p", o->sampling.min_p)->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o->sampling.seed)->capture_default_str();
  cmd->add_option("--device", o->device, "auto|cpu|cuda (auto = cuda when built with it and a GPU is visible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "(CUDA only)")->capture_default_str()->check(CLI::Range(0.05, 1.0));
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  add_format_flags(cmd, &o->formats);
  add_parallel_flags(cmd, &o->tp);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace mx::cli
