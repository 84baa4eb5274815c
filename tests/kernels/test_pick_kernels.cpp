// The pick kernels against host references (label gpu: needs a device): greedy argmax and its
// log-prob, the pick over a vocabulary split by tensor parallelism, temperature sampling, top-k softmax.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/decode/decode_gemv.h"
#include "model/logit_adjust.h"
#include "model/sampler.h"
#include "tests/kernels/gpu_test_util.h"

namespace {

using mx::test::from_dev;
using mx::test::to_dev;

class ArgmaxRows : public ::testing::TestWithParam<int> {};  // V: 5003 scalar path, 5004 vector path

TEST_P(ArgmaxRows, LowestIdOnTiesAndLogprob) {
  const int V = GetParam(), S = 3;
  std::vector<float> lg(size_t(S) * V);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 2);
  for (auto& v : lg) v = n(rng);
  lg[1234] = 50; lg[4000] = 50; lg[V - 2] = 50;  // a tie in row 0, across chunks when there are several
  lg[V + 5002] = 40;
  lg[2 * size_t(V) + V - 1] = 45;                 // the last id, in the (partial) last chunk
  int32_t* dt; float* dl; float* dlg = to_dev(lg);
  float* dpart;
  cudaMalloc(&dt, S * 4); cudaMalloc(&dl, S * 4); cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(S, V) * 4);
  mx::cuda::launch_argmax_logprob(dlg, S, V, V, dt, dl, dpart, 0);
  auto t = from_dev(dt, S);
  auto lp = from_dev(dl, S);
  EXPECT_EQ(t[0], 1234);
  EXPECT_EQ(t[1], 5002);
  EXPECT_EQ(t[2], V - 1);
  for (int s = 0; s < S; ++s) {
    const float* r = &lg[size_t(s) * V];
    int best = 0;
    double z = 0;
    for (int i = 0; i < V; ++i) if (r[i] > r[best]) best = i;
    for (int i = 0; i < V; ++i) z += std::exp(double(r[i]) - r[best]);
    EXPECT_EQ(t[s], best);
    EXPECT_NEAR(lp[s], -std::log(z), 1e-5);
  }
  cudaFree(dt); cudaFree(dl); cudaFree(dlg); cudaFree(dpart);
}
// One chunk (5003, 5004) and several with a partial last one (201088: 32 chunks, the gpt-oss vocabulary).
INSTANTIATE_TEST_SUITE_P(CudaKernels, ArgmaxRows, ::testing::Values(5003, 5004, 9001, 201088));

// Logit adjustments (logit_bias, min_tokens' bans, penalties; model/logit_adjust.h): each entry of the rows
// [s0, s0 + S) inside the slice [id0, id0 + n) is applied as apply_logit_adjustments does, bit for bit
// (rounded ops, no FMA), nothing else changes; then the pick and its log-prob skip the banned ids, even
// where a thread's first logits are all banned (the log-sum must not take exp(-inf - -inf)).
TEST(CudaKernels, AdjustLogitsThenPick) {
  const int V = 5003, S = 3, s0 = 2;
  const float ninf = -INFINITY;
  std::vector<float> lg(size_t(S) * V);
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0, 2);
  for (auto& v : lg) v = n(rng);
  lg[size_t(V) + 77] = 60;  // row 1's pick, banned below
  std::vector<mx::LogitAdjustEntry> entries;
  auto add = [&](int s, int id, float v, float rep = 1.f, float sub = 0.f) { entries.push_back({s, id, v, rep, sub}); };
  for (int id = 0; id < 600; ++id) add(s0, id, ninf);  // row 0's first ids: every thread's first logits
  add(s0, 700, 100.f);                                  // row 0's pick: a bias
  add(s0 + 1, 77, ninf, 1.3f, 0.75f);                   // a ban with penalties: still -inf
  add(s0 + 1, V - 1, ninf); add(s0 + 2, 2500, -7.5f); add(s0 + 2, 2600, ninf);
  for (int id = 3000; id < 3400; id += 3)  // penalties: repetition on both signs, subtractions, a bias first
    add(s0 + 2, id, id % 2 ? 0.f : 1.25f, id % 5 ? 1.7f : 1.f, id % 7 ? 0.5f + 0.25f * float(id % 4) : 0.f);
  for (int id = 1000; id < 1100; ++id) add(s0 + 1, id, 0.f, 0.6f, -0.3f);  // a penalty below 1, a negative one
  add(s0 - 1, 5, ninf); add(s0 + S, 6, ninf); add(s0, V + 3, ninf); add(s0, -1, ninf);  // out of range: untouched
  std::vector<int32_t> adj(1 + entries.size() * mx::cuda::kAdjustWords);
  adj[0] = int32_t(entries.size());
  std::memcpy(adj.data() + 1, entries.data(), entries.size() * sizeof(mx::LogitAdjustEntry));
  for (int slice = 0; slice < 2; ++slice) {
    SCOPED_TRACE(slice ? "slice [2000, 3500)" : "whole row");
    const int id0 = slice ? 2000 : 0, nid = slice ? 1500 : V;
    std::vector<float> want = lg;
    mx::apply_logit_adjustments(want.data() + id0, V, id0, nid, entries, s0, S);
    float* dlg = to_dev(lg);
    int32_t* dadj = to_dev(adj);
    mx::cuda::launch_adjust_logits(dlg + id0, V, id0, nid, dadj, s0, S, 0);
    auto got = from_dev(dlg, lg.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
    int32_t* dt; float* dl; float* dpart;
    cudaMalloc(&dt, S * 4); cudaMalloc(&dl, S * 4); cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(S, V) * 4);
    mx::cuda::launch_argmax_logprob(dlg, S, V, V, dt, dl, dpart, 0);
    auto t = from_dev(dt, S);
    auto lp = from_dev(dl, S);
    for (int s = 0; s < S; ++s) {
      const float* r = &want[size_t(s) * V];
      const int best = int(std::max_element(r, r + V) - r);
      double z = 0;
      for (int i = 0; i < V; ++i) z += std::exp(double(r[i]) - r[best]);
      EXPECT_EQ(t[s], best) << "row " << s;
      EXPECT_NEAR(lp[s], -std::log(z), 1e-5) << "row " << s;
    }
    cudaFree(dlg); cudaFree(dadj); cudaFree(dt); cudaFree(dl); cudaFree(dpart);
  }
}

// Constrained rows' masks (structured output): every id whose bit is clear gets -inf on the masked rows of
// [s0, s0 + S), inside the slice [id0, id0 + n) (ids past the bits too), nothing else changes (exact); a
// mask count below the slots leaves the other slots' rows alone; then the pick takes the best allowed id.
TEST(CudaKernels, MaskLogitsThenPick) {
  const int V = 5003, S = 4, s0 = 1, slots = 3, words = (V + 31) / 32;
  std::vector<float> lg(size_t(S) * V);
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0, 2);
  for (auto& v : lg) v = n(rng);
  std::vector<int32_t> mask(size_t(1 + slots) + size_t(slots) * words, 0);
  mask[0] = 2;             // two rows masked; slot 2 (row s0 + 3) is past the count
  mask[1] = s0 + 2;        // slot 0: row 2 of the block
  mask[2] = s0 + 0;        // slot 1: row 0
  mask[3] = s0 + 3;
  auto bits = [&](int slot) { return reinterpret_cast<uint32_t*>(mask.data() + 1 + slots) + size_t(slot) * words; };
  for (int id : {7, 31, 32, 2500, 4999, V - 1}) bits(0)[id / 32] |= 1u << (id % 32);
  for (int id = 1000; id < 3000; id += 3) bits(1)[id / 32] |= 1u << (id % 32);
  for (int id = 0; id < V; ++id) bits(2)[id / 32] &= 0u;  // would mask everything, were it counted
  for (int slice = 0; slice < 2; ++slice) {
    SCOPED_TRACE(slice ? "slice [2000, 3500)" : "whole row");
    const int id0 = slice ? 2000 : 0, nid = slice ? 1500 : V;
    std::vector<float> want = lg;
    for (int k = 0; k < mask[0]; ++k) {
      const int s = mask[1 + k] - s0;
      for (int id = id0; id < id0 + nid; ++id)
        if (!(bits(k)[id / 32] >> (id % 32) & 1)) want[size_t(s) * V + id] = -INFINITY;
    }
    float* dlg = to_dev(lg);
    int32_t* dmask = to_dev(mask);
    mx::cuda::launch_mask_logits(dlg + id0, V, id0, nid, dmask, slots, words, s0, S, 0);
    auto got = from_dev(dlg, lg.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
    if (slice == 0) {
      int32_t* dt; float* dl; float* dpart;
      cudaMalloc(&dt, S * 4); cudaMalloc(&dl, S * 4); cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(S, V) * 4);
      mx::cuda::launch_argmax_logprob(dlg, S, V, V, dt, dl, dpart, 0);
      auto t = from_dev(dt, S);
      for (int s = 0; s < S; ++s) {
        const float* r = &want[size_t(s) * V];
        EXPECT_EQ(t[s], int(std::max_element(r, r + V) - r)) << "row " << s;
      }
      EXPECT_TRUE(t[2] == 7 || t[2] == 31 || t[2] == 32 || t[2] == 2500 || t[2] == 4999 || t[2] == V - 1);
      cudaFree(dt); cudaFree(dl); cudaFree(dpart);
    }
    cudaFree(dlg); cudaFree(dmask);
  }
}

// The pick over a vocabulary split by tensor parallelism (argmax_parts on each slice, the partials laid
// out as gathered, argmax_merge) is the one-GPU pick: the same ids (greedy, ties across slices, Gumbel
// samples keyed by the global id, an id limit inside the last slice) and log-probs within 1e-5.
TEST(CudaKernels, ArgmaxSplitOverRanksIsTheOneGpuPick) {
  const int V = 201088, S = 6, limit = V - 100;
  std::vector<float> lg(size_t(S) * V);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 2);
  for (auto& v : lg) v = nd(rng);
  lg[77] = 60; lg[150001] = 60;          // row 0: a tie across slices
  lg[size_t(1) * V + V - 1] = 90;        // row 1: past the limit, never picked
  lg[size_t(2) * V + limit - 1] = 70;    // row 2: the last id allowed
  std::vector<float> it(S, 0.f);
  std::vector<uint64_t> keys(S, 0);
  for (int s = 3; s < S; ++s) { it[size_t(s)] = 1.f / 0.7f; keys[size_t(s)] = mx::sample_stream_key(7, uint64_t(s)); }
  float* dlg = to_dev(lg);
  float* dit = to_dev(it);
  uint64_t* dkeys = to_dev(keys);
  int32_t* dt; float* dl; float* dpart;
  cudaMalloc(&dt, S * 4); cudaMalloc(&dl, S * 4);
  cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(S, V, 8) * 4);
  mx::cuda::launch_argmax_logprob(dlg, S, V, limit, dt, dl, dpart, 0, dit, dkeys);
  const auto want_t = from_dev(dt, S);
  const auto want_lp = from_dev(dl, S);
  EXPECT_EQ(want_t[0], 77);
  EXPECT_NE(want_t[1], V - 1);
  EXPECT_EQ(want_t[2], limit - 1);
  for (int ranks : {2, 4, 8}) {
    const int n = mx::cuda::argmax_chunks_split((V + ranks - 1) / ranks, ranks);
    const size_t part = size_t(S) * n * mx::cuda::kArgmaxPartFloats;
    ASSERT_LE(part * ranks, mx::cuda::argmax_scratch_floats(S, V, ranks));
    std::vector<float*> slices;
    for (int q = 0; q < ranks; ++q) {  // slices of multiples of 8 ids, the last takes the rest
      const int b = (q * (V / 8) / ranks) * 8, e = q == ranks - 1 ? V : ((q + 1) * (V / 8) / ranks) * 8, R = e - b;
      std::vector<float> sl(size_t(S) * R);
      for (int s = 0; s < S; ++s) std::copy_n(&lg[size_t(s) * V + b], R, &sl[size_t(s) * R]);
      slices.push_back(to_dev(sl));
      mx::cuda::launch_argmax_parts(slices.back(), S, R, std::clamp(limit - b, 0, R), b, n, dpart + q * part, 0, dit,
                                    dkeys);
    }
    cudaMemset(dt, 0xff, S * 4);
    mx::cuda::launch_argmax_merge(dpart, ranks, S, n, dt, dl, 0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(from_dev(dt, S), want_t) << ranks << " ranks";
    const auto lp = from_dev(dl, S);
    for (int s = 0; s < S; ++s) EXPECT_NEAR(lp[size_t(s)], want_lp[size_t(s)], 1e-5) << ranks << " ranks, row " << s;
    for (float* d : slices) cudaFree(d);
  }
  cudaFree(dlg); cudaFree(dit); cudaFree(dkeys); cudaFree(dt); cudaFree(dl); cudaFree(dpart);
}

// GPU temperature sampling (Gumbel-max in the greedy-pick kernel): 40000 draws from one 64-logit
// row follow softmax(logits / T) (every id within 5 sigma of its binomial count), every row's
// logprob is the raw log-softmax at its pick (1e-5), rows with inv_temp 0 stay greedy, and a second
// launch repeats every draw (same keys).
TEST(CudaKernels, GpuSamplingFollowsSoftmax) {
  const int V = 64, N = 40000;
  const float T = 0.8f;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0, 1.5f);
  std::vector<float> row(V);
  for (auto& v : row) v = nd(rng);
  std::vector<float> lg(size_t(N) * V);
  for (int i = 0; i < N; ++i) std::copy(row.begin(), row.end(), lg.begin() + size_t(i) * V);
  std::vector<float> it(N, 1.0f / T);
  std::vector<uint64_t> keys(N);
  for (int i = 0; i < N; ++i) {
    keys[i] = mx::sample_stream_key(42, uint64_t(i));
    if (i % 1000 == 0) it[i] = 0.f;
  }
  float* dlg = to_dev(lg);
  float* dit = to_dev(it);
  uint64_t* dkeys = to_dev(keys);
  int32_t* dt; float* dl;
  float* dpart;
  cudaMalloc(&dt, N * 4); cudaMalloc(&dl, N * 4); cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(N, V) * 4);
  mx::cuda::launch_argmax_logprob(dlg, N, V, V, dt, dl, dpart, 0, dit, dkeys);
  auto tok = from_dev(dt, N);
  auto lp = from_dev(dl, N);
  mx::cuda::launch_argmax_logprob(dlg, N, V, V, dt, dl, dpart, 0, dit, dkeys);
  EXPECT_EQ(from_dev(dt, N), tok);
  const float mx = *std::max_element(row.begin(), row.end());
  double z = 0, zt = 0;
  for (float v : row) { z += std::exp(double(v) - mx); zt += std::exp(double(v - mx) / T); }
  const int greedy = int(std::max_element(row.begin(), row.end()) - row.begin());
  std::vector<int> count(V, 0);
  int n = 0;
  for (int i = 0; i < N; ++i) {
    ASSERT_TRUE(tok[i] >= 0 && tok[i] < V) << i;
    EXPECT_NEAR(lp[i], row[tok[i]] - mx - std::log(z), 1e-5) << i;
    if (it[i] == 0.f) EXPECT_EQ(tok[i], greedy);
    else { ++count[tok[i]]; ++n; }
  }
  for (int v = 0; v < V; ++v) {
    const double p = std::exp(double(row[v] - mx) / T) / zt, want = n * p;
    EXPECT_LE(std::fabs(count[v] - want), 5 * std::sqrt(want * (1 - p)) + 1) << "id " << v << " p " << p;
  }
  cudaFree(dlg); cudaFree(dit); cudaFree(dkeys); cudaFree(dt); cudaFree(dl); cudaFree(dpart);
}

// Exact: top-k picks (lowest index on ties) and the softmax over them, vs a host reference.
TEST(CudaKernels, TopkSoftmaxMatchesReference) {
  const int M = 77, E = 128, k = 4;
  std::vector<float> lg(size_t(M) * E);
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 1);
  for (auto& v : lg) v = n(rng);
  lg[5 * E + 7] = lg[5 * E + 9] = 9.f;  // tie: 7 before 9
  float* dlg = to_dev(lg);
  int32_t* di; float* dw;
  cudaMalloc(&di, M * k * 4); cudaMalloc(&dw, M * k * 4);
  mx::cuda::launch_topk_softmax(dlg, di, dw, M, E, k, 0);
  auto idx = from_dev(di, M * k);
  auto w = from_dev(dw, M * k);
  for (int m = 0; m < M; ++m) {
    std::vector<int> ord(E);
    for (int e = 0; e < E; ++e) ord[e] = e;
    const float* r = &lg[size_t(m) * E];
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return r[a] > r[b]; });
    double z = 0;
    for (int j = 0; j < k; ++j) z += std::exp(double(r[ord[j]]) - r[ord[0]]);
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(idx[m * k + j], ord[j]) << m;
      EXPECT_NEAR(w[m * k + j], std::exp(double(r[ord[j]]) - r[ord[0]]) / z, 1e-6);
    }
  }
  cudaFree(dlg); cudaFree(di); cudaFree(dw);
}

}  // namespace
