// Golden-logit files (tools/goldens/make_logits.py) and the fixture they were made from: shared by
// the CPU reference test (tests/model) and the CUDA engine test (tests/kernels).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
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

// A 120b-width shard takes ~35 s to hash and a GPU run checks it in ten tests: hashed once a process,
// again only when its size or write time changed.
inline std::string sha256_file_once(const std::string& path) {
  namespace fs = std::filesystem;
  struct Seen { uintmax_t size; fs::file_time_type mtime; std::string hex; };
  static std::mutex mu;
  static std::map<std::string, Seen> seen;
  const uintmax_t size = fs::file_size(path);
  const fs::file_time_type mtime = fs::last_write_time(path);
  std::lock_guard<std::mutex> lock(mu);
  auto it = seen.find(path);
  if (it == seen.end() || it->second.size != size || it->second.mtime != mtime)
    it = seen.insert_or_assign(path, Seen{size, mtime, sha256_file(path)}).first;
  return it->second.hex;
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
    EXPECT_EQ(sha256_file_once((fs::path(dir) / name).string()), hash.get<std::string>())
        << "fixture shard " << name << " differs from the one the goldens were made from";
  return dir;
}

}  // namespace mx::test
