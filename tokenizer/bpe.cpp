#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace mx::tok {
namespace {

uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h;
}

uint64_t hash_pair(uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 31);
}

uint64_t pow2_at_least(uint64_t n) {
  uint64_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

std::string printable(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F && c != '\\')
      s.push_back(char(c));
    else
      s += fmt::format("\\x{:02x}", c);
  }
  return s;
}

}  // namespace

void BpeModel::insert_token(int32_t id, const std::string& source) {
  const std::string& t = tokens_[size_t(id)];
  const uint64_t h = hash_bytes(t.data(), t.size());
  for (uint64_t i = h & vocab_mask_;; i = (i + 1) & vocab_mask_) {
    VocabSlot& s = vocab_[i];
    if (s.id < 0) {
      s = {uint32_t(h >> 32), id};
      return;
    }
    if (s.hash == uint32_t(h >> 32) && tokens_[size_t(s.id)] == t)
      fail("{}: token '{}' appears twice in model.vocab (ids {} and {})", source, printable(t), s.id, id);
  }
}

int32_t BpeModel::lookup(std::string_view bytes) const {
  if (vocab_.empty()) return -1;
  const uint64_t h = hash_bytes(bytes.data(), bytes.size());
  for (uint64_t i = h & vocab_mask_;; i = (i + 1) & vocab_mask_) {
    const VocabSlot& s = vocab_[i];
    if (s.id < 0) return -1;
    if (s.hash == uint32_t(h >> 32) && tokens_[size_t(s.id)] == bytes) return s.id;
  }
}

void BpeModel::insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  for (uint64_t i = hash_pair(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    if (merge_keys_[i] == kNoMerge || merge_keys_[i] == key) {
      // A repeated pair keeps the later rank, as HF's map construction does.
      merge_keys_[i] = key;
      merge_vals_[i] = (uint64_t(rank) << 32) | uint32_t(new_id);
      return;
    }
  }
}

uint64_t BpeModel::merge_of(int32_t a, int32_t b) const {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  for (uint64_t i = hash_pair(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    const uint64_t k = merge_keys_[i];
    if (k == key) return merge_vals_[i];
    if (k == kNoMerge) return kNoMerge;
  }
}

void BpeModel::build(std::vector<std::string> tokens,
                     const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                     bool ignore_merges, const std::string& source) {
  tokens_ = std::move(tokens);
  ignore_merges_ = ignore_merges;
  size_t count = 0;
  for (const auto& t : tokens_) count += !t.empty();
  vocab_.assign(pow2_at_least(count * 2), VocabSlot{0, -1});
  vocab_mask_ = vocab_.size() - 1;
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (!tokens_[id].empty()) insert_token(int32_t(id), source);
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    byte_id_[b] = lookup(std::string_view(&c, 1));
    if (byte_id_[b] < 0)
      fail("{}: model.vocab has no token for byte 0x{:02x} (not a byte-level BPE vocab)", source, b);
  }

  merge_keys_.assign(pow2_at_least(merges.size() * 2), kNoMerge);
  merge_vals_.assign(merge_keys_.size(), kNoMerge);
  merge_mask_ = merge_keys_.size() - 1;
  std::string both;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [l, rt] = merges[r];
    const int32_t a = lookup(l), b = lookup(rt);
    both.assign(l);
    both.append(rt);
    const int32_t c = lookup(both);
    if (a < 0 || b < 0 || c < 0)
      fail("{}: merge #{} ('{}' + '{}') uses a token that is not in model.vocab", source, r, printable(l),
           printable(rt));
    insert_merge(a, b, uint32_t(r), c);
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    const int32_t id = lookup(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (piece.size() <= kSmallPiece)
    merge_small(piece, out);
  else
    merge_heap(piece, out);
}

// Quadratic in the piece length but allocation-free and cache-friendly: the common case.
void BpeModel::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n > kSmallPiece) return merge_heap(piece, out);
  int32_t sym[kSmallPiece];
  uint64_t mrg[kSmallPiece];  // mrg[i] = merge of (sym[i], sym[i+1])
  for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) mrg[i] = merge_of(sym[i], sym[i + 1]);
  size_t m = n;
  while (m > 1) {
    size_t best = 0;
    uint64_t best_v = kNoMerge;
    for (size_t i = 0; i + 1 < m; ++i)
      if (mrg[i] < best_v) {  // rank is the high half: strict < keeps the leftmost
        best_v = mrg[i];
        best = i;
      }
    if (best_v == kNoMerge) break;
    sym[best] = int32_t(uint32_t(best_v));
    std::memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof(int32_t));
    if (best + 3 < m) std::memmove(mrg + best + 1, mrg + best + 2, (m - best - 3) * sizeof(uint64_t));
    --m;
    if (best > 0) mrg[best - 1] = merge_of(sym[best - 1], sym[best]);
    if (best + 1 < m) mrg[best] = merge_of(sym[best], sym[best + 1]);
  }
  out.insert(out.end(), sym, sym + m);
}

// O(n log n): a min-heap of (rank, position) over a linked list of symbols, with stale entries
// skipped on pop (same order of merges as merge_small).
void BpeModel::merge_heap(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id, prev, next;
  };
  const int32_t n = int32_t(piece.size());
  // Per-thread scratch: long pieces are rare, but a request can hold many.
  thread_local std::vector<Sym> s;
  thread_local std::vector<uint64_t> heap;
  s.resize(size_t(n));
  heap.clear();
  const auto push = [&](int32_t pos) {
    const uint64_t m = merge_of(s[size_t(pos)].id, s[size_t(s[size_t(pos)].next)].id);
    if (m == kNoMerge) return;
    heap.push_back((m >> 32 << 32) | uint32_t(pos));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i < n; ++i)
    s[size_t(i)] = {byte_id_[static_cast<unsigned char>(piece[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t pos = int32_t(uint32_t(top));
    Sym& a = s[size_t(pos)];
    if (a.id < 0 || a.next < 0) continue;
    const uint64_t m = merge_of(a.id, s[size_t(a.next)].id);
    if (m == kNoMerge || (m >> 32) != (top >> 32)) continue;  // stale entry
    Sym& b = s[size_t(a.next)];
    a.id = int32_t(uint32_t(m));
    a.next = b.next;
    b.id = -1;
    if (a.next >= 0) s[size_t(a.next)].prev = pos;
    if (a.prev >= 0) push(a.prev);
    if (a.next >= 0) push(pos);
  }
  for (int32_t i = 0; i >= 0; i = s[size_t(i)].next) out.push_back(s[size_t(i)].id);
  if (s.capacity() > (1u << 16)) {  // don't keep a pathological piece's scratch alive
    std::vector<Sym>().swap(s);
    std::vector<uint64_t>().swap(heap);
  }
}

}  // namespace mx::tok
