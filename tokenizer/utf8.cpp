#include "tokenizer/utf8.h"

namespace mx::utf8 {

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const Step st = step(s, i);
    if (!st.valid) return i;
    i += st.len;
  }
  return n;
}

void append_lossy(std::string& out, std::string_view s) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < s.size()) {
    const Step st = step(s, i);
    if (st.valid) {
      i += st.len;
      continue;
    }
    out.append(s.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += st.len;
    run = i;
  }
  out.append(s.data() + run, s.size() - run);
}

size_t incomplete_tail(std::string_view s) {
  // A character is at most 4 bytes, so only a lead byte among the last 3 can start a cut one.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const Step st = step(s, n - back);
    return (!st.valid && st.truncated && st.len == back) ? back : 0;
  }
  return 0;
}

}  // namespace mx::utf8
