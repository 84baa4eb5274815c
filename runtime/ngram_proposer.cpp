#include "runtime/ngram_proposer.h"

#include <algorithm>

namespace mx::runtime {

int propose_ngram(std::span<const int32_t> tokens, int k, int min_n, int max_n, std::vector<int32_t>& out) {
  const int len = int(tokens.size());
  if (k <= 0 || min_n < 1 || max_n < min_n) return 0;
  const int lo = std::max(0, len - kNgramLookback);
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    const int32_t* tail = tokens.data() + len - n;
    // Start positions of an earlier occurrence, latest first; it must be followed by at least one token.
    for (int start = len - n - 1; start >= lo; --start) {
      if (tokens[size_t(start + n - 1)] != tail[n - 1] || !std::equal(tail, tail + n, tokens.data() + start)) continue;
      const int from = start + n, take = std::min(k, len - from);
      out.insert(out.end(), tokens.begin() + from, tokens.begin() + from + take);
      return take;
    }
  }
  return 0;
}

}  // namespace mx::runtime
