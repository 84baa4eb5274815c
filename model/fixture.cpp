#include "model/fixture.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "model/tensor_specs.h"

// Byte-identical output everywhere: forbid fusing n*std + 1 into an FMA (GCC contracts across
// statements by default, and does emit FMA on aarch64 or with -march=native).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace mx {
namespace {

namespace fs = std::filesystem;

// Counter-based generator: value i of tensor t depends only on (seed, t, i), so tensors can be
// generated in parallel chunks and are byte-identical on every machine. Only integer ops and
// IEEE +,* are used (no libm), so no platform's math library changes a bit.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline float uniform01(uint64_t bits) { return float(bits >> 40) * (1.0f / 16777216.0f); }

// Approximately standard normal: Irwin-Hall sum of four uniforms, rescaled to unit variance.
inline float normal(uint64_t key, uint64_t i) {
  uint64_t h = splitmix64(key ^ (i * 0xd1b54a32d192ed03ull));
  float s = uniform01(h) + uniform01(splitmix64(h + 1)) + uniform01(splitmix64(h + 2)) + uniform01(splitmix64(h + 3));
  return (s - 2.0f) * 1.7320508f;
}

enum class Kind { kEmbed, kLinearW, kBias, kNorm, kSinks, kRouterW, kBlocks, kScales };

Kind kind_of(const std::string& name) {
  auto ends = [&](const char* s) {
    size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  if (name == "model.embed_tokens.weight") return Kind::kEmbed;
  if (ends("_blocks")) return Kind::kBlocks;
  if (ends("_scales")) return Kind::kScales;
  if (ends("layernorm.weight") || name == "model.norm.weight") return Kind::kNorm;
  if (ends("sinks")) return Kind::kSinks;
  if (ends("router.weight")) return Kind::kRouterW;
  if (ends("bias")) return Kind::kBias;
  return Kind::kLinearW;
}

// E8M0 exponent that makes random E2M1 codes (rms 2.93) dequantize to std ~ 1/sqrt(fan_in).
int base_scale(int64_t fan_in) {
  double target = 1.0 / (2.926 * std::sqrt(double(fan_in)));
  return 127 + int(std::lround(std::log2(target)));
}

struct Gen {
  Kind kind;
  uint64_t key;
  float std;       // for bf16 kinds
  int scale_base;  // for scales
};

void fill_chunk(const Gen& g, uint8_t* out, uint64_t first, uint64_t count) {
  switch (g.kind) {
    case Kind::kBlocks:
      for (uint64_t i = 0; i < count; ++i) out[i] = uint8_t(splitmix64(g.key ^ ((first + i) * 0x9e3779b97f4a7c15ull)));
      return;
    case Kind::kScales:
      for (uint64_t i = 0; i < count; ++i) {
        uint64_t h = splitmix64(g.key ^ ((first + i) * 0x9e3779b97f4a7c15ull));
        out[i] = uint8_t(g.scale_base + int(h % 3) - 1);  // jitter -1, 0, +1 per 32-block
      }
      return;
    default: {
      auto* o = reinterpret_cast<uint16_t*>(out);
      for (uint64_t i = 0; i < count; ++i) {
        float v = normal(g.key, first + i) * g.std;
        if (g.kind == Kind::kNorm) v += 1.0f;
        o[i] = f32_to_bf16(v);
      }
    }
  }
}

Gen make_gen(const TensorSpec& s, uint64_t seed, uint64_t index, const ModelConfig& c) {
  Gen g{kind_of(s.name), splitmix64(seed * 0x100000001b3ull + index + 1), 0.0f, 0};
  int64_t fan_in = s.shape.size() >= 2 ? s.shape[1] : 1;
  switch (g.kind) {
    case Kind::kEmbed: g.std = 1.0f; break;
    case Kind::kLinearW: g.std = float(1.0 / std::sqrt(double(fan_in))); break;
    case Kind::kRouterW: g.std = float(3.0 / std::sqrt(double(fan_in))); break;  // decisive routing
    case Kind::kBias: g.std = 0.02f; break;
    case Kind::kNorm: g.std = 0.1f; break;
    case Kind::kSinks: g.std = 1.0f; break;
    case Kind::kScales: {
      bool gate_up = s.name.find("gate_up") != std::string::npos;
      g.scale_base = base_scale(gate_up ? c.hidden_size : c.intermediate_size);
      break;
    }
    case Kind::kBlocks: break;
  }
  return g;
}

uint64_t nbytes_of(const TensorSpec& s) {
  uint64_t n = uint64_t(dtype_size(s.dtype));
  for (auto d : s.shape) n *= uint64_t(d);
  return n;
}

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) fail("cannot write {} (disk full?)", path);
}

}  // namespace

ModelConfig fixture_config(const FixtureOptions& opt) {
  ModelConfig c = preset_config(opt.preset);
  if (opt.num_layers != -1) {
    if (opt.num_layers < 1 || opt.num_layers > 1024) fail("--layers must be in [1, 1024], got {}", opt.num_layers);
    c.num_layers = opt.num_layers;
    c.layer_is_sliding.assign(c.num_layers, 0);
    for (int i = 0; i < c.num_layers; ++i) c.layer_is_sliding[i] = (i % 2 == 0);
  }
  if (opt.num_experts != -1) {
    if (opt.num_experts < c.experts_per_token || opt.num_experts > 1024)
      fail("--experts must be in [{}, 1024], got {}", c.experts_per_token, opt.num_experts);
    c.num_experts = opt.num_experts;
  }
  return c;
}

void write_fixture(const FixtureOptions& opt) {
  using nlohmann::json;
  using nlohmann::ordered_json;
  if (opt.out_dir.empty()) fail("fixture: no output directory given");
  const ModelConfig cfg = fixture_config(opt);
  fs::path tok_json = fs::path(opt.tokenizer_dir) / "tokenizer.json";
  fs::path tok_cfg = fs::path(opt.tokenizer_dir) / "tokenizer_config.json";
  if (!fs::exists(tok_json))
    fail("{} not found: run scripts/setup.sh to fetch the gpt-oss tokenizer (or pass --tokenizer-dir)", tok_json.string());
  if (opt.max_shard_bytes < (1u << 20)) fail("max shard size must be at least 1 MiB");
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail("cannot create {}: {}", opt.out_dir, ec.message());

  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream f(fs::path(opt.out_dir) / name, std::ios::binary);
    f << text;
    if (!f) fail("cannot write {}/{}", opt.out_dir, name);
  };
  write_text("config.json", model_config_to_json(cfg));
  write_text("generation_config.json", generation_config_to_json(cfg));
  fs::copy_file(tok_json, fs::path(opt.out_dir) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
  if (ec) fail("cannot copy {}: {}", tok_json.string(), ec.message());
  if (fs::exists(tok_cfg)) {
    fs::copy_file(tok_cfg, fs::path(opt.out_dir) / "tokenizer_config.json", fs::copy_options::overwrite_existing, ec);
    if (ec) fail("cannot copy {}: {}", tok_cfg.string(), ec.message());
  }

  // Plan shards at tensor boundaries, in checkpoint order.
  auto specs = expected_tensors(cfg);
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t n = nbytes_of(specs[i]);
    if (cur > 0 && cur + n > opt.max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
    total += n;
  }
  const size_t last = shards.size() - 1;
  auto shard_name = [&](size_t s) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", s, last); };

  ThreadPool pool(0);
  constexpr uint64_t kChunk = 64ull << 20;
  std::vector<uint8_t> buf(kChunk);
  ordered_json weight_map = ordered_json::object();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t s = 0; s < shards.size(); ++s) {
    ordered_json header = ordered_json::object();
    header["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (size_t i : shards[s]) {
      uint64_t n = nbytes_of(specs[i]);
      header[specs[i].name] = {{"dtype", dtype_name(specs[i].dtype)}, {"shape", specs[i].shape},
                               {"data_offsets", {off, off + n}}};
      off += n;
      weight_map[specs[i].name] = shard_name(s);
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
    std::string path = (fs::path(opt.out_dir) / shard_name(s)).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot create {}", path);
    uint8_t len[8];
    for (int k = 0; k < 8; ++k) len[k] = uint8_t(uint64_t(h.size()) >> (8 * k));
    try {
      write_all(f, len, 8, path);
      write_all(f, h.data(), h.size(), path);
      for (size_t i : shards[s]) {
        const Gen g = make_gen(specs[i], opt.seed, i, cfg);
        const uint64_t esize = uint64_t(dtype_size(specs[i].dtype));
        const uint64_t numel = nbytes_of(specs[i]) / esize;
        const uint64_t per_chunk = kChunk / esize;
        for (uint64_t first = 0; first < numel; first += per_chunk) {
          uint64_t count = std::min(per_chunk, numel - first);
          // Split the chunk over threads; element index alone decides each value.
          pool.parallel_for(int64_t((count + 65535) / 65536), [&](int64_t b, int64_t e) {
            for (int64_t p = b; p < e; ++p) {
              uint64_t lo = uint64_t(p) * 65536, hi = std::min(count, lo + 65536);
              fill_chunk(g, buf.data() + lo * esize, first + lo, hi - lo);
            }
          });
          write_all(f, buf.data(), count * esize, path);
        }
      }
    } catch (...) {
      std::fclose(f);
      throw;
    }
    if (std::fclose(f) != 0) fail("cannot finish writing {}", path);
  }
  ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  write_text("model.safetensors.index.json", index.dump(2) + "\n");
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("fixture: wrote {} tensors, {:.3f} GB in {} shard(s) to {} in {:.1f} s", specs.size(), total / 1e9,
            shards.size(), opt.out_dir, sec);
}

}  // namespace mx
