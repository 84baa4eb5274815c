// GPU kernels and the CUDA runner against the CPU references (label gpu: needs a device).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/parallel.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/cuda_runner.h"
#include "model/checkpoint.h"
#include "model/cpu_reference.h"
#include "model/fixture.h"
#include "model/weights.h"

namespace {

template <class T>
T* to_dev(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <class T>
std::vector<T> from_dev(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Tolerance: bf16 weights and fp32 activations on both sides; only summation order differs,
// so |err| <= 1e-4 * (sum |w x| + 1).
TEST(CudaKernels, GemvBf16MatchesReferenceOddSizes) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [M, N, K] : {std::tuple{1, 7, 8}, std::tuple{5, 37, 72}, std::tuple{13, 129, 2880}}) {
    std::vector<uint16_t> W(size_t(N) * K), b(N);
    std::vector<float> x(size_t(M) * K);
    for (auto& w : W) w = mx::f32_to_bf16(u(rng));
    for (auto& w : b) w = mx::f32_to_bf16(u(rng));
    for (auto& v : x) v = u(rng);
    std::vector<float> y0(size_t(M) * N, NAN);  // poisoned
    uint16_t* dW = to_dev(W); uint16_t* db = to_dev(b); float* dx = to_dev(x); float* dy = to_dev(y0);
    mx::cuda::launch_gemv_bf16(dW, db, dx, dy, M, N, K, N, false, 0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto y = from_dev(dy, y0.size());
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < N; ++r) {
        double ref = mx::bf16_to_f32(b[r]), mag = 1;
        for (int c = 0; c < K; ++c) {
          double t = double(mx::bf16_to_f32(W[size_t(r) * K + c])) * x[size_t(m) * K + c];
          ref += t;
          mag += std::fabs(t);
        }
        ASSERT_NEAR(y[size_t(m) * N + r], ref, 1e-4 * mag) << M << "x" << N << "x" << K << " m=" << m << " r=" << r;
      }
    cudaFree(dW); cudaFree(db); cudaFree(dx); cudaFree(dy);
  }
}

TEST(CudaKernels, ArgmaxLowestIdOnTiesAndLogprob) {
  const int V = 5003, S = 3;
  std::vector<float> lg(size_t(S) * V);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 2);
  for (auto& v : lg) v = n(rng);
  lg[1234] = 50; lg[4000] = 50;  // tie in row 0
  lg[V + 5002] = 40;             // last element in row 1
  int32_t* dt; float* dl; float* dlg = to_dev(lg);
  cudaMalloc(&dt, S * 4); cudaMalloc(&dl, S * 4);
  mx::cuda::launch_argmax_logprob(dlg, S, V, dt, dl, 0);
  auto t = from_dev(dt, S);
  auto lp = from_dev(dl, S);
  EXPECT_EQ(t[0], 1234);
  EXPECT_EQ(t[1], 5002);
  for (int s = 0; s < S; ++s) {
    const float* r = &lg[size_t(s) * V];
    int best = 0;
    double z = 0;
    for (int i = 0; i < V; ++i) if (r[i] > r[best]) best = i;
    for (int i = 0; i < V; ++i) z += std::exp(double(r[i]) - r[best]);
    EXPECT_EQ(t[s], best);
    EXPECT_NEAR(lp[s], -std::log(z), 1e-5);
  }
  cudaFree(dt); cudaFree(dl); cudaFree(dlg);
}

// End to end on the tiny fixture: a 7-token prefill step, then 6 decode steps, two sequences
// batched (the second one offset); every sampled position's logits vs the CPU reference.
// Tolerance: relative L2 <= 2e-2 (bf16 KV cache vs the reference's fp32), argmax equal.
TEST(CudaRunner, TinyFixtureMatchesCpuReference) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / "mx_cuda_tiny_fixture").string();
  fs::remove_all(dir);
  mx::FixtureOptions fo;
  fo.preset = "tiny";
  fo.seed = 7;
  fo.out_dir = dir;
  mx::write_fixture(fo);
  mx::ModelConfig cfg = mx::load_model_config(dir);
  mx::Checkpoint ck = mx::Checkpoint::open(dir);
  mx::ModelWeights w = mx::bind_weights(ck, cfg);
  mx::ThreadPool pool(2);
  mx::CpuReference ref(cfg, w, &pool);

  mx::CudaEngineOptions opt;
  opt.model_dir = dir;
  opt.max_model_len = 64;
  opt.max_num_seqs = 4;
  opt.max_tokens_per_step = 64;
  opt.num_kv_blocks = 16;
  opt.block_size = 4;
  opt.keep_logits = true;
  auto gpu = mx::make_cuda_runner(opt);

  const int P = 7, steps = 6, N = P + steps;
  std::vector<std::vector<int32_t>> toks(2, std::vector<int32_t>(N));
  std::mt19937 rng(11);
  for (auto& t : toks) for (auto& v : t) v = int32_t(rng() % cfg.vocab_size);
  std::vector<std::vector<int32_t>> bt = {{0, 1, 2, 3}, {9, 4, 12, 6}};  // non-contiguous blocks
  mx::CpuKvCache kv;
  kv.allocate(cfg, 4, 16);
  std::vector<std::vector<float>> ref_logits(2 * N, std::vector<float>(cfg.vocab_size));
  for (int s = 0; s < 2; ++s)
    for (int p = 0; p < N; ++p) ref.forward_token(toks[s][p], p, bt[s].data(), kv, ref_logits[s * N + p].data());

  double worst = 0;
  int agree = 0, total = 0;
  for (int st = 0; st <= steps; ++st) {
    std::vector<mx::SeqStep> seqs(2);
    for (int s = 0; s < 2; ++s) {
      const int start = st == 0 ? 0 : P + st - 1, n = st == 0 ? P : 1;
      seqs[s].seq_id = s;
      seqs[s].tokens = std::span<const int32_t>(toks[s].data() + start, n);
      seqs[s].start_pos = start;
      seqs[s].block_table = bt[s];
      seqs[s].sample = true;
      seqs[s].sampling.temperature = 0;
    }
    std::vector<mx::SampleResult> out(2);
    gpu->step(seqs, out);
    for (int s = 0; s < 2; ++s) {
      const int p = seqs[s].start_pos + int(seqs[s].tokens.size()) - 1;
      auto g = gpu->last_logits(s);
      ASSERT_EQ(int(g.size()), cfg.vocab_size);
      const auto& r = ref_logits[s * N + p];
      double num = 0, den = 0;
      int am = 0;
      for (int i = 0; i < cfg.vocab_size; ++i) {
        num += (g[i] - r[i]) * double(g[i] - r[i]);
        den += double(r[i]) * r[i];
        if (r[i] > r[am]) am = i;
      }
      const double rel = std::sqrt(num / den);
      worst = std::max(worst, rel);
      agree += out[s].token == am;
      ++total;
      EXPECT_LT(rel, 2e-2) << "seq " << s << " pos " << p;
    }
  }
  std::printf("[tiny e2e] worst relative L2 of logits %.3e, argmax agreement %d/%d\n", worst, agree, total);
  EXPECT_EQ(agree, total);
  fs::remove_all(dir);
}

}  // namespace
