// Why this is exact, not just close: sample_sorted walks weights w = float(exp(...)) in `better`
// order and compares the draw with double prefix sums. That order only matters through the
// rounding of those sums, so we (1) keep only weights that can change a double sum, (2) sort the
// weights by value with a radix sort (equal weights are interchangeable in a sum, and w is
// monotone in the logit, so value order gives the same sequence of sums), and (3) recover the id
// at the chosen rank from the few candidates that share its weight.
//
// (1): every walk starts with the best candidate, whose weight is exp(0) = 1, so each partial sum
// is >= 1 and adding w < 2^-53 (under half an ulp of 1) leaves it unchanged. Such weights can
// never be where the walk stops, except when the draw falls past every significant weight; then
// we return -1 and the caller runs sample_sorted. Like sample_sorted's own min_p cut, this
// relies on exp() being monotone (glibc's is, to its sub-ulp error).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/sampler.h"
#include "model/sampler_detail.h"

namespace mx::sampler_detail {
namespace {

constexpr float kNoOpWeight = 0x1p-53f;  // smaller weights never change a sum that is >= 1
// exp(-37.5) < 2^-53 even after rounding to float: skip exp() for anything below.
constexpr double kSkipExponent = -37.5;
constexpr uint32_t kOneBits = 0x3F800000u;  // bit pattern of 1.0f, the largest weight

// Per-thread so that steady-state sampling allocates nothing; sized to the vocabulary once.
struct Buffers {
  std::vector<int> id;         // significant candidates, vocab order
  std::vector<uint32_t> key;   // kOneBits - bits(weight): ascending key = descending weight
  std::vector<uint32_t> tmp;
  std::vector<uint32_t> count;
  std::vector<double> prefix;  // prefix[k] = double sum of the k+1 largest weights, in order
  std::vector<int> tie;
};

// LSD radix sort, two 15-bit digits: keys stay below 2^29 (weights in [2^-53, 1]), and two wide
// passes measured faster than three 10-bit ones at 200k keys.
constexpr int kDigitBits = 15, kDigits = 1 << kDigitBits;

// Both digit histograms, gathered while the keys are produced rather than in a pass of its own.
void count_digits(uint32_t key, uint32_t* count) {
  ++count[key & (kDigits - 1)];
  ++count[kDigits + (key >> kDigitBits)];
}

// Sorts keys[0, n) ascending; `count` (from count_digits) is consumed; tmp holds n keys.
void radix_sort(uint32_t* keys, uint32_t* tmp, size_t n, uint32_t* count) {
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = pass * kDigitBits;
    uint32_t* c = count + pass * kDigits;
    uint32_t off = 0;
    for (int d = 0; d < kDigits; ++d) off += std::exchange(c[d], off);
    for (size_t i = 0; i < n; ++i) tmp[c[(keys[i] >> shift) & (kDigits - 1)]++] = keys[i];
    std::swap(keys, tmp);  // after the second pass the sorted keys are back in the caller's array
  }
}

float weight_of(uint32_t key) { return std::bit_cast<float>(kOneBits - key); }

// At T = 1 the weight's argument a = float(logit - mx) differs from the term's argument
// x = logit - mx (double) only by that float rounding, |a - x| < 2^-18 for a >= -37.5, so
// f = term * exp(a - x) is exp(a) to about 2^-49. Unless f lies within 2^13 double ulps (about
// 2^-40) of a midpoint between two floats, glibc's exp(a) (within 2^-51) rounds to the same
// float; in that rare case ask exp() itself. A midpoint is where the 29 bits that float
// rounding drops read exactly 2^28.
float weight_from_term(double term, double x, double a) {
  const double d = a - x;
  const double f = term * (1 + d * (1 + 0.5 * d));
  const uint32_t dropped = uint32_t(std::bit_cast<uint64_t>(f)) & 0x1FFFFFFFu;
  const bool near_midpoint = dropped - ((1u << 28) - (1u << 13)) <= (1u << 14);
  return near_midpoint ? float(std::exp(a)) : float(f);
}

// Fills b.id / b.key / w with the weights >= kNoOpWeight, in vocab order; -1 on NaN logits
// (sample_sorted's behaviour there is left as it is).
template <bool kUnitT>
int significant_weights(const float* logits, int vocab, float mx, float t, const double* terms, Buffers& b,
                        std::vector<float>& w) {
  b.id.resize(vocab);
  b.key.resize(vocab);
  w.resize(vocab);
  b.count.assign(2 * kDigits, 0);
  // Pass 1, branch-free: which ids can reach the exp() threshold. Branching on it mispredicts
  // for a large share of the vocabulary; the float threshold is looser than kSkipExponent by far
  // more than its rounding, and pass 2 decides exactly.
  const float d_min = float(kSkipExponent) * t;
  int n = 0;
  bool nan = false;
  for (int i = 0; i < vocab; ++i) {
    const float d = logits[i] - mx;
    b.id[n] = i;
    n += d >= d_min;
    nan |= d != d;
  }
  if (nan) return -1;
  int c = 0;
  for (int k = 0; k < n; ++k) {
    const int i = b.id[k];
    // The same expression sample_sorted rounds; dividing by 1 is exact and costly.
    const double a = kUnitT ? double(logits[i] - mx) : double(logits[i] - mx) / t;
    const float wi = kUnitT ? weight_from_term(terms[i], double(logits[i]) - mx, a) : float(std::exp(a));
    if (wi < kNoOpWeight) continue;
    b.id[c] = i;  // c <= k: compacting in place
    b.key[c] = kOneBits - std::bit_cast<uint32_t>(wi);
    count_digits(b.key[c], b.count.data());
    w[c++] = wi;
  }
  return c;
}

}  // namespace

int sample_fast(const float* logits, int vocab, float mx, const double* terms, const SamplingParams& p,
                uint64_t rng_step, std::vector<float>& scratch) {
  const float t = p.temperature;
  if (!std::isfinite(mx) || !std::isfinite(t) || !(t > 0.0f) || (terms && t != 1.0f)) return -1;
  thread_local Buffers b;
  const int c = terms ? significant_weights<true>(logits, vocab, mx, t, terms, b, scratch)
                      : significant_weights<false>(logits, vocab, mx, t, terms, b, scratch);  // scratch: weights of b.id
  if (c <= 0) return -1;
  b.tmp.resize(vocab);
  radix_sort(b.key.data(), b.tmp.data(), c, b.count.data());

  const int keep = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  const int n_sig = std::min(c, keep);  // significant weights among the kept
  b.prefix.resize(vocab);
  double cum = 0;
  for (int k = 0; k < n_sig; ++k) b.prefix[k] = cum += weight_of(b.key[k]);

  int n = n_sig;
  if (p.min_p > 0.0f) {
    const float thr = p.min_p * weight_of(b.key[0]);
    // Keys ascend as weights descend: count the weights >= thr.
    n = int(std::upper_bound(b.key.begin(), b.key.begin() + n_sig, thr, [](float v, uint32_t k) { return weight_of(k) < v; }) -
            b.key.begin());
    n = std::max(n, 1);
  }
  const double* pre = b.prefix.data();
  if (p.top_p < 1.0f) {
    const double target = p.top_p * pre[n - 1];
    const int m = int(std::lower_bound(pre, pre + n, target) - pre);  // first prefix >= target
    if (m == n) return -1;  // cannot happen for top_p < 1; be safe rather than differ
    n = m + 1;
  }
  const double u = sample_uniform(p.seed, rng_step) * pre[n - 1];
  const int j = int(std::upper_bound(pre, pre + n, u) - pre);  // first prefix > u
  if (j == n) return -1;  // the walk ends on the last kept id, possibly a no-op weight

  // Rank j in `better` order: the (j - first)-th best among the candidates weighing w_j.
  const uint32_t kj = b.key[j];
  int first = j;
  while (first > 0 && b.key[first - 1] == kj) --first;
  const float wj = weight_of(kj);
  if (first == j && (j + 1 == c || b.key[j + 1] != kj)) {  // the usual case: no other id weighs w_j
    for (int i = 0; i < c; ++i)
      if (scratch[i] == wj) return b.id[i];
    return -1;
  }
  b.tie.clear();
  for (int i = 0; i < c; ++i)
    if (scratch[i] == wj) b.tie.push_back(b.id[i]);
  const int r = j - first;
  if (r >= int(b.tie.size())) return -1;
  std::nth_element(b.tie.begin(), b.tie.begin() + r, b.tie.end(), [&](int x, int y) { return better(logits, x, y); });
  return b.tie[r];
}

}  // namespace mx::sampler_detail
