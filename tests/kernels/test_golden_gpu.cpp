// The CUDA engine against the golden logits from Hugging Face transformers (fp32, eager), on the
// same fixtures as the CPU reference test (tests/model/test_golden_logits.cpp). Label gpu.
//
// Tolerance: the engine computes with bf16 activations, bf16 KV cache and fp32 accumulation, the
// goldens in fp32. Measured on an H100: tiny 4.8e-3, 2-layer 120b widths 2.3e-2 relative L2 (bf16
// rounding of every activation, as any bf16 engine). Required: relative L2 over the checked logits
// <= 3e-2 and greedy picks equal except at near ties: a reference gap within twice that tolerance
// (6% of the logits' RMS), the criterion of the CPU end-to-end tests. The tensor-core prefill step
// at 120b widths swaps one such pair (gap 2.3% of the RMS, H100) while its rel L2 is lower (1.9e-2).
// The FP8 KV cache adds E4M3's rounding of every K and V value (up to 2^-4 relative): the CPU reference
// with that cache is at 3.5e-2 (tiny) and 8.9e-2 (120b widths) rel L2, with 51 of 213 greedy picks
// changed at 120b widths (docs/equivalence.md): the format's error on these random layers, not the
// kernels'. Required: rel L2 within 1.3x of the CPU reference's (tiny 4.5e-2, 120b widths 1.15e-1);
// greedy changes are printed, not bounded. Quantized dense layers (--mxfp4-layers / --fp8-layers all) add
// their rounding: the CPU reference is at 2.11e-1 (MXFP4) and 4.54e-2 (FP8) on tiny (docs/equivalence.md);
// required: within 1.3x of it, greedy changes printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/engine/cuda_runner.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/model/golden_fixture.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// prefill_first > 0: the first min(prefill_first, n / 2) prompt tokens go in one step (the tensor-core
// prefill path; its last position is checked), then one token per step (the decode path reading the
// KV cache the prefill wrote).
void check_gpu_golden(const char* name, int prefill_first = 0, bool fp8 = false, const mx::DenseQuant& dense = {},
                      double dense_tol = 0, int tp = 1, mx::MoeSplit moe = mx::MoeSplit::kIntermediate) {
  const double tol = dense.any() ? dense_tol : !fp8 ? 3e-2 : std::string(name) == "tiny.json" ? 4.5e-2 : 1.15e-1;
  const fs::path path = fs::path(MX_SOURCE_DIR) / "tests/data/goldens" / name;
  if (!fs::exists(path)) GTEST_SKIP() << path << " is missing";
  json g = json::parse(mx::read_text_file(path.string()));
  bool temporary = false;
  const std::string dir = mx::test::golden_fixture_dir(g, &temporary);
  if (dir.empty()) GTEST_SKIP() << name << ": set MXSERVE_FIXTURE_CACHE to write its large fixture";
  std::vector<int> subset = g["subset_ids"].get<std::vector<int>>();
  double num = 0, den = 0, max_abs = 0;
  int positions = 0, mismatches = 0, swaps = 0;
  for (const auto& p : g["prompts"]) {
    std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    mx::CudaEngineOptions opt;
    opt.model_dir = dir;
    opt.block_size = 16;
    opt.max_model_len = int(ids.size() + 15) / 16 * 16;
    opt.max_num_seqs = 1;
    opt.max_tokens_per_step = 64;
    opt.num_kv_blocks = 2 * (opt.max_model_len / 16 + 2);
    opt.keep_logits = true;
    opt.kv_fp8 = fp8;
    opt.dense = dense;
    opt.tp.size = tp;
    opt.tp.moe = moe;
    auto gpu = mx::make_cuda_runner(opt);
    const int nb = opt.max_model_len / 16;
    std::vector<int32_t> table(nb);
    for (int i = 0; i < nb; ++i) table[i] = nb + 1 - i;  // non-identity block order on purpose
    std::vector<int32_t> sliding(nb);  // the sliding layers' own blocks, after them
    for (int i = 0; i < nb; ++i) sliding[i] = nb + 2 + (i + 1) % nb;
    const size_t first = prefill_first > 0 ? std::min<size_t>(prefill_first, ids.size() / 2) : 1;
    for (size_t t = first - 1; t < ids.size(); ++t) {
      const size_t t0 = t == first - 1 ? 0 : t;
      const mx::SampleResult r =
          mx::test::greedy_step(*gpu, std::span<const int32_t>(&ids[t0], t + 1 - t0), int(t0), table, sliding);
      auto logits = gpu->last_logits(0);
      ASSERT_EQ(int(logits.size()), gpu->config().vocab_size);
      const json& pos = p["positions"][t];
      double rms = 0;
      int n = 0;
      auto check = [&](int id, float want) {
        const double d = double(logits[id]) - want;
        max_abs = std::max(max_abs, std::abs(d));
        num += d * d;
        den += double(want) * want;
        rms += double(want) * want;
        ++n;
      };
      auto sub = pos["subset_logits"].get<std::vector<float>>();
      for (size_t i = 0; i < subset.size(); ++i) check(subset[i], sub[i]);
      auto top_ids = pos["top_ids"].get<std::vector<int>>();
      auto top_val = pos["top_logits"].get<std::vector<float>>();
      for (size_t i = 0; i < top_ids.size(); ++i) check(top_ids[i], top_val[i]);
      if (r.token != top_ids[0]) {
        ++swaps;
        // A near tie is acceptable: the reference logit of our pick within 2 x tol of the RMS.
        float ref_pick = -1e30f;
        for (size_t i = 0; i < top_ids.size(); ++i)
          if (top_ids[i] == r.token) ref_pick = top_val[i];
        if (top_val[0] - ref_pick > 2 * tol * std::sqrt(rms / n)) {
          ++mismatches;
          std::printf("  greedy mismatch at position %zu: picked %d, reference gap %.4f (%.2f%% of the RMS)\n", t, r.token,
                      top_val[0] - ref_pick, 100 * (top_val[0] - ref_pick) / std::sqrt(rms / n));
        }
      }
      ++positions;
    }
  }
  if (temporary) fs::remove_all(dir);
  const double rel = std::sqrt(num / den);
  std::printf("[gpu golden %s, first step %d tokens, kv %s, %s, %d GPU] positions %d, max abs err %.3g, rel L2 %.3g, greedy mismatches (not near ties) %d, near-tie swaps %d\n",
              name, prefill_first, fp8 ? "fp8" : "bf16", dense.describe().c_str(), tp, positions, max_abs, rel, mismatches, swaps - mismatches);
  EXPECT_LE(rel, tol);
  if (!fp8 && !dense.any()) {
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(GoldenLogitsGpu, TinyMatchesTransformers) { check_gpu_golden("tiny.json"); }
TEST(GoldenLogitsGpu, Width120bTwoLayersMatchesTransformers) { check_gpu_golden("w120_l2.json"); }
TEST(GoldenLogitsGpu, TinyPrefillStepMatchesTransformers) { check_gpu_golden("tiny.json", 64); }
TEST(GoldenLogitsGpu, Width120bPrefillStepMatchesTransformers) { check_gpu_golden("w120_l2.json", 64); }
TEST(GoldenLogitsGpu, TinyFp8KvCache) { check_gpu_golden("tiny.json", 0, true); }
TEST(GoldenLogitsGpu, TinyPrefillStepFp8KvCache) { check_gpu_golden("tiny.json", 64, true); }
TEST(GoldenLogitsGpu, Width120bTwoLayersFp8KvCache) { check_gpu_golden("w120_l2.json", 0, true); }
TEST(GoldenLogitsGpu, Width120bPrefillStepFp8KvCache) { check_gpu_golden("w120_l2.json", 64, true); }
// Tensor parallelism over two GPUs at gpt-oss's widths (4 KV heads, 1,472 / 1,408 intermediate columns and
// half the vocabulary a rank): the one-GPU tolerance, decode and prefill steps.
bool gpus_with_nccl(int want) {
  int n = 0;
  std::string why;
  return cudaGetDeviceCount(&n) == cudaSuccess && n >= want && mx::cuda::nccl_available(&why);
}
TEST(GoldenLogitsGpu, Width120bTwoLayersTwoGpus) {
  if (!gpus_with_nccl(2)) GTEST_SKIP() << "needs two GPUs and libnccl.so.2";
  check_gpu_golden("w120_l2.json", 0, false, {}, 0, 2);
  check_gpu_golden("w120_l2.json", 64, false, {}, 0, 2);
  check_gpu_golden("w120_l2.json", 0, false, {}, 0, 2, mx::MoeSplit::kExperts);
  check_gpu_golden("w120_l2.json", 64, false, {}, 0, 2, mx::MoeSplit::kExperts);
}
// Four GPUs (nvidia-h100-x4): 2 KV heads, 768 / 704 intermediate columns and a quarter of the vocabulary a
// rank; decode steps on the intermediate split, a prefill step on whole experts (32 a GPU).
TEST(GoldenLogitsGpu, Width120bTwoLayersFourGpus) {
  if (!gpus_with_nccl(4)) GTEST_SKIP() << "needs four GPUs and libnccl.so.2";
  check_gpu_golden("w120_l2.json", 0, false, {}, 0, 4);
  check_gpu_golden("w120_l2.json", 64, false, {}, 0, 4, mx::MoeSplit::kExperts);
}
TEST(GoldenLogitsGpu, TinyMxfp4DenseLayers) {
  check_gpu_golden("tiny.json", 0, false, mx::parse_dense_quant("all", "none"), 0.275);
  check_gpu_golden("tiny.json", 64, false, mx::parse_dense_quant("all", "none"), 0.275);
}
TEST(GoldenLogitsGpu, TinyFp8DenseLayers) {
  check_gpu_golden("tiny.json", 0, false, mx::parse_dense_quant("none", "all"), 0.059);
  check_gpu_golden("tiny.json", 64, false, mx::parse_dense_quant("none", "all"), 0.059);
}

}  // namespace
