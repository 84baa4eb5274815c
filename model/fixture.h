// Random-weight gpt-oss checkpoints in exactly the Hugging Face layout, for tests and
// benchmarks (no real weights can be downloaded here). Same options + seed = same bytes on
// every machine (no std:: distributions; a counter-based generator).
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace mx {

struct FixtureOptions {
  std::string preset = "tiny";     // tiny | 20b | 120b
  int num_layers = -1;             // override the preset's layer count (-1 = keep)
  int num_experts = -1;            // override the preset's expert count (-1 = keep)
  uint64_t seed = 0;
  std::string out_dir;
  // Directory holding tokenizer.json (+ tokenizer_config.json) to copy into the fixture.
  std::string tokenizer_dir = std::string(MXSERVE_ASSET_DIR) + "/tokenizer";
  uint64_t max_shard_bytes = 4000000000ull;  // shards split at tensor boundaries (= the CLI default, 4 GB)
};

// The config the options describe (preset + overrides).
ModelConfig fixture_config(const FixtureOptions& opt);

// Writes config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
// model-0000i-of-0000N.safetensors shards and model.safetensors.index.json into opt.out_dir.
void write_fixture(const FixtureOptions& opt);

}  // namespace mx
