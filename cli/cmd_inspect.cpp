#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace mx::cli {

void add_inspect_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("inspect", "Load and validate a checkpoint; print a summary");
  cmd->add_option("--model", *dir, "model directory")->required();
  cmd->callback([dir] {
    ModelConfig cfg = load_model_config(*dir);
    Checkpoint ck = Checkpoint::open(*dir);
    bind_weights(ck, cfg);  // validates every tensor the config implies
    std::map<std::string, uint64_t> by_dtype;
    uint64_t total = 0;
    for (const auto& [name, t] : ck.tensors()) {
      by_dtype[dtype_name(t.dtype)] += t.nbytes;
      total += t.nbytes;
    }
    int sliding = 0;
    for (auto s : cfg.layer_is_sliding) sliding += s;
    std::printf("model: %s\nlayers: %d (%d sliding, window %d)\nhidden: %d  heads: %d q / %d kv x %d\n"
                "experts: %d (top-%d), intermediate %d\nvocab: %d\ntensors: %zu, %.3f GB\n",
                dir->c_str(), cfg.num_layers, sliding, cfg.sliding_window, cfg.hidden_size, cfg.num_heads,
                cfg.num_kv_heads, cfg.head_dim, cfg.num_experts, cfg.experts_per_token, cfg.intermediate_size,
                cfg.vocab_size, ck.tensors().size(), total / 1e9);
    for (const auto& [dt, n] : by_dtype) std::printf("  %-6s %.3f GB\n", dt.c_str(), n / 1e9);
    std::printf("ok\n");
  });
}

}  // namespace mx::cli
