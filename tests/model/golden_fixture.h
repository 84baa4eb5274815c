// Golden-logit files (tools/goldens/make_logits.py) and the fixture they were made from: shared by
// the CPU reference test (tests/model) and the CUDA engine test (tests/kernels).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/mmap_file.h"
#include "model/fixture.h"
#include "tests/model/sha256.h"

namespace mx::test {

inline std::string sha256_file(const std::string& path) {
  MappedFile f(path);
  Sha256 h;
  h.update(f.data(), f.size());
  return h.hex();
}

// Writes (or reuses, under MXSERVE_FIXTURE_CACHE) the golden's fixture and checks its shard hashes.
// Returns "" when the fixture is too large to write without a cache directory (the caller skips).
inline std::string golden_fixture_dir(const nlohmann::json& g, bool* temporary) {
  const nlohmann::json& fx = g["fixture"];
  FixtureOptions opt;
  opt.preset = fx["preset"].get<std::string>();
  opt.seed = fx["seed"].get<uint64_t>();
  opt.num_layers = fx["layers"].get<int>();
  opt.num_experts = fx["experts"].get<int>();
  namespace fs = std::filesystem;
  std::string dir;
  const char* cache = std::getenv("MXSERVE_FIXTURE_CACHE");  // tests only: reuse big fixtures
  *temporary = false;
  if (cache) {
    dir = fmt::format("{}/{}-L{}-E{}-s{}", cache, opt.preset, opt.num_layers, opt.num_experts, opt.seed);
  } else if (opt.preset == "tiny") {
    dir = (fs::temp_directory_path() / fmt::format("mxserve-golden-{}-{}", opt.preset, ::getpid())).string();
    *temporary = true;
  } else {
    return "";
  }
  if (!fs::exists(fs::path(dir) / "model.safetensors.index.json")) {
    opt.out_dir = dir;
    write_fixture(opt);
  }
  for (auto& [name, hash] : fx["shards_sha256"].items())
    EXPECT_EQ(sha256_file((fs::path(dir) / name).string()), hash.get<std::string>())
        << "fixture shard " << name << " differs from the one the goldens were made from";
  return dir;
}

}  // namespace mx::test
