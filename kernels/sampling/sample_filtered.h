// Sampling with top-k / min-p / top-p on the GPU, so a filtered request does not copy its 0.8 MB
// logit row to the host. One cluster of 8 CTAs per sampled row; rows without a filter (or greedy)
// return at once, keeping the token the greedy / Gumbel pick (decode_kernels.h) already wrote.
//
// The kept set follows the host sampler (model/sampler.cpp, sample_sorted): candidates in the order
// (logit descending, id ascending), weights w = exp((logit - max) / T); top_k keeps a prefix, min_p
// the prefix with w >= min_p * w_max, top_p the shortest prefix of those whose weights sum to
// >= top_p of their total. The prefixes are found by radix selection over a 64-bit order key (logit
// bits, then the inverted id), counting candidates (top_k) or summing their weights in double
// (top_p), 8 bits per pass over the row. The token is then the Gumbel-max draw over the kept set:
// argmax of logit / T - log(-log(u_i)) with u_i from the row's stream (stream_random.cuh), a sample
// from the kept weights renormalized. The host sampler draws by inverse CDF from another stream, so
// the two agree in distribution, not draw by draw.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

struct SampleFilterParams {
  const float* logits = nullptr;  // fp32 [S, stride]
  int stride = 0;                 // the model vocabulary
  int V = 0;                      // ids >= V are never sampled (the tokenizer's size)
  int S = 0;
  const float* inv_temp = nullptr;   // [S] 1 / T; 0 = greedy (no sampling)
  const uint64_t* keys = nullptr;    // [S] random stream per row
  const int32_t* top_k = nullptr;    // [S] 0 = off
  const float* top_p = nullptr;      // [S] 1 = off
  const float* min_p = nullptr;      // [S] 0 = off
  int32_t* tok = nullptr;            // [S] overwritten for filtered rows
  float* logprob = nullptr;          // [S] log-softmax of the raw logits at the token
  bool one_cta_per_row = false;      // the path of GPUs without clusters (so tests run it anywhere)
};
void sample_filtered(const SampleFilterParams& p, cudaStream_t s);

// CPU reference of one row (same kept set, same stream, same score formula); returns the token, or -1
// when no logit is finite. Tests compare it with the kernel.
int sample_filtered_ref(const float* logits, int V, float inv_temp, uint64_t key, int top_k, float top_p, float min_p);

}  // namespace mx::cuda
