// CPU reference of the filtered sampler (sample_filtered.h): the kept set by sorting, the draw by the
// same Gumbel-max over the same stream.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/common/stream_random.cuh"
#include "kernels/sampling/sample_filtered.h"
#include "kernels/sampling/sample_filtered_math.h"

namespace mx::cuda {

int sample_filtered_ref(const float* logits, int V, float inv_temp, uint64_t key, int top_k, float top_p, float min_p) {
  std::vector<int> idx;
  float mx = -INFINITY;
  for (int i = 0; i < V; ++i) {
    const float x = sf::canon(logits[i]);
    if (!sf::valid(x)) continue;
    idx.push_back(i);
    mx = std::max(mx, x);
  }
  if (idx.empty() || !(mx < INFINITY)) return -1;
  std::sort(idx.begin(), idx.end(), [&](int a, int b) {
    return sf::order_key(sf::canon(logits[a]), a) > sf::order_key(sf::canon(logits[b]), b);
  });
  size_t n = idx.size();
  if (top_k > 0) n = std::min(n, size_t(top_k));
  if (min_p > 0.f)
    while (n > 1 && !(sf::weight(sf::canon(logits[idx[n - 1]]), mx, inv_temp) >= min_p)) --n;
  if (top_p < 1.f) {
    uint64_t total = 0;
    for (size_t j = 0; j < n; ++j) total += sf::fixed_weight(sf::canon(logits[idx[j]]), mx, inv_temp);
    const uint64_t target = sf::top_p_target(total, top_p);
    uint64_t cum = 0;
    size_t m = 0;
    while (m < n) {
      cum += sf::fixed_weight(sf::canon(logits[idx[m++]]), mx, inv_temp);
      if (cum >= target) break;
    }
    n = std::max<size_t>(m, 1);
  }
  int best_id = idx[0];
  float best = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    const int i = idx[j];
    const float sc = sf::gumbel_score(sf::canon(logits[i]), inv_temp, stream_uniform(key, i));
    if (sc > best || (sc == best && i < best_id)) { best = sc; best_id = i; }
  }
  return best_id;
}

}  // namespace mx::cuda
