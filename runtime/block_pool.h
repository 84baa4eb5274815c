// Paged-KV block allocator: ref-counted blocks and a free list. The runner owns the KV memory;
// this only hands out block ids in [0, num_blocks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mx::runtime {

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);
  int num_blocks() const { return int(ref_.size()); }
  int num_free() const { return int(free_.size()); }
  // Returns -1 when no block is free (the caller preempts).
  int32_t allocate();
  void add_ref(int32_t block);
  void release(int32_t block);  // back to the free list when the count reaches 0
  int ref_count(int32_t block) const { return ref_[size_t(block)]; }

 private:
  std::vector<int> ref_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
};

}  // namespace mx::runtime
