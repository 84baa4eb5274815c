#include "runtime/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace mx::runtime {
namespace {

// splitmix64's finalizer: a bijection with full avalanche, so chaining it over the tokens makes
// every id (and its position in the block) affect every output bit.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t default_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = mix64(h + uint64_t(uint32_t(t)) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  return mix64(h ^ uint64_t(tokens.size()));
}

BlockPool::BlockPool(int num_blocks, int block_size, bool enable_caching, BlockHashFn hash)
    : block_size_(block_size), caching_(enable_caching), hash_(hash ? hash : default_block_hash),
      ref_(size_t(std::max(num_blocks, 0)), 0), meta_(ref_.size()) {
  MX_CHECK(num_blocks > 0, "the KV cache has no blocks");
  MX_CHECK(block_size > 0, "bad KV block size {}", block_size);
  free_.reserve(size_t(num_blocks));
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    unregister(b);
  } else {
    return -1;
  }
  ref_[size_t(b)] = 1;
  ++meta_[size_t(b)].gen;
  return b;
}

void BlockPool::add_ref(int32_t block) {
  Meta& m = meta_[size_t(block)];
  if (ref_[size_t(block)] == 0) {
    MX_CHECK(m.registered, "add_ref on free KV block {}", block);
    lru_.erase(m.lru_pos);
  }
  ++ref_[size_t(block)];
}

void BlockPool::release(int32_t block) {
  MX_CHECK(ref_[size_t(block)] > 0, "KV block {} released twice", block);
  if (--ref_[size_t(block)] > 0) return;
  Meta& m = meta_[size_t(block)];
  if (m.registered) m.lru_pos = lru_.insert(lru_.end(), block);
  else free_.push_back(block);
}

void BlockPool::unregister(int32_t block) {
  Meta& m = meta_[size_t(block)];
  if (!m.registered) return;
  auto it = cached_.find(m.hash);
  if (it != cached_.end() && it->second == block) cached_.erase(it);
  m.registered = false;
  m.tokens.clear();
}

int32_t BlockPool::match_block(uint64_t hash, int32_t parent, std::span<const int32_t> tokens, bool sliding) {
  if (!caching_) return -1;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const Meta& m = meta_[size_t(it->second)];
  const bool same_parent =
      parent < 0 ? m.parent < 0 : (m.parent == parent && m.parent_gen == meta_[size_t(parent)].gen);
  if (m.sliding != sliding || !same_parent ||
      !std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end()))
    return -1;  // a collision
  add_ref(it->second);
  return it->second;
}

std::vector<int32_t> BlockPool::match(std::span<const int32_t> tokens, int max_blocks, std::vector<uint64_t>& hashes) {
  std::vector<int32_t> out;
  hashes.clear();
  if (!caching_) return out;
  uint64_t parent_hash = kRootHash;
  int32_t parent = -1;
  const int n = std::min(max_blocks, int(tokens.size()) / block_size_);
  for (int i = 0; i < n; ++i) {
    auto blk = tokens.subspan(size_t(i) * size_t(block_size_), size_t(block_size_));
    const uint64_t h = hash_(parent_hash, blk);
    const int32_t b = match_block(h, parent, blk);
    if (b < 0) break;
    out.push_back(b);
    hashes.push_back(h);
    parent_hash = h;
    parent = b;
  }
  return out;
}

void BlockPool::register_block(int32_t block, uint64_t hash, int32_t parent, std::span<const int32_t> tokens,
                               bool sliding) {
  if (!caching_) return;
  MX_CHECK(int(tokens.size()) == block_size_ && ref_[size_t(block)] > 0, "registering KV block {} that is not full or not held", block);
  Meta& m = meta_[size_t(block)];
  if (m.registered || cached_.count(hash)) return;
  m.hash = hash;
  m.registered = true;
  m.sliding = sliding;
  m.parent = parent;
  m.parent_gen = parent < 0 ? 0 : meta_[size_t(parent)].gen;
  m.tokens.assign(tokens.begin(), tokens.end());
  cached_.emplace(hash, block);
}

}  // namespace mx::runtime
