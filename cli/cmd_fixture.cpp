#include <CLI/CLI.hpp>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "model/fixture.h"

namespace mx::cli {

void add_fixture_command(CLI::App& app) {
  auto opt = std::make_shared<FixtureOptions>();
  auto shard_gb = std::make_shared<double>(4.0);
  auto* cmd = app.add_subcommand("fixture", "Write a random-weight gpt-oss checkpoint in the exact Hugging Face layout");
  cmd->add_option("--preset", opt->preset, "tiny|mini|20b|120b (mini: the GPU tests' model, head_dim 64, 2 KV heads)")->capture_default_str()->check(CLI::IsMember({"tiny", "mini", "20b", "120b"}));
  cmd->add_option("--layers", opt->num_layers, "override the number of layers");
  cmd->add_option("--experts", opt->num_experts, "override the number of experts");
  cmd->add_option("--seed", opt->seed, "random seed (same seed, same bytes)")->capture_default_str();
  cmd->add_option("--max-shard-gb", *shard_gb, "shard size limit in GB")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--tokenizer-dir", opt->tokenizer_dir, "folder with tokenizer.json to copy")->capture_default_str();
  cmd->add_option("out_dir", opt->out_dir, "output directory")->required();
  cmd->callback([opt, shard_gb] {
    opt->max_shard_bytes = uint64_t(*shard_gb * 1e9);
    write_fixture(*opt);
  });
}

}  // namespace mx::cli
