#include "runtime/block_pool.h"

#include "core/error.h"

namespace mx::runtime {

BlockPool::BlockPool(int num_blocks) : ref_(size_t(num_blocks), 0) {
  MX_CHECK(num_blocks > 0, "the KV cache has no blocks");
  free_.reserve(size_t(num_blocks));
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  ref_[size_t(b)] = 1;
  return b;
}

void BlockPool::add_ref(int32_t block) { ++ref_[size_t(block)]; }

void BlockPool::release(int32_t block) {
  MX_CHECK(ref_[size_t(block)] > 0, "KV block {} released twice", block);
  if (--ref_[size_t(block)] == 0) free_.push_back(block);
}

}  // namespace mx::runtime
