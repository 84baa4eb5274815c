#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>

#include "cli/commands.h"
#include "core/error.h"
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
  std::string device = "cpu";
  int threads = 0;
};

void run_generate(const GenerateOptions& o) {
  if (o.device != "cpu") fail("--device {}: the CUDA engine is not available in this build; use --device cpu", o.device);
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

  CpuRunnerOptions ro;
  ro.model_dir = o.model_dir;
  ro.num_threads = o.threads;
  ro.kv_block_size = 16;
  ro.kv_tokens = int((prompt.size() + o.max_tokens + 15) / 16 * 16);
  ro.vocab_limit = tok->vocab_size();
  CpuRunner runner(ro);
  const ModelConfig& cfg = runner.config();
  if (!o.chat) stops = cfg.eos_token_ids;
  if (int(prompt.size()) + o.max_tokens > cfg.max_position_embeddings)
    fail("prompt ({} tokens) + max tokens ({}) exceed the model's {} positions", prompt.size(), o.max_tokens,
         cfg.max_position_embeddings);

  std::vector<int32_t> blocks(runner.kv_shape().num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  IncrementalDecoder dec(tok);
  SampleResult res[1];
  SeqStep s{.seq_id = 0, .tokens = prompt, .start_pos = 0, .block_table = blocks, .sample = true, .sampling = o.sampling};

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  runner.step({&s, 1}, res);
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
    runner.step({&s, 1}, res);
    next = res[0].token;
  }
  std::string tail = dec.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::printf("\n");
  auto t2 = clock::now();
  double pre = std::chrono::duration<double>(t1 - t0).count(), dec_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prompt %zu tokens, %.1f tok/s; generated %d tokens, %.1f tok/s (device cpu)\n", prompt.size(),
               prompt.size() / pre, generated, generated > 1 ? (generated - 1) / dec_s : 0.0);
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
  cmd->add_option("--device", o->device, "cpu|cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace mx::cli
