// Paged-KV block allocator: ref-counted blocks, a free list and the prefix cache index. The
// runner owns the KV memory; this only hands out block ids in [0, num_blocks).
//
// Prefix cache (vLLM-style automatic prefix caching): a full block whose KV is computed can be
// registered under the hash of its token chain (parent block's hash + its own token ids). When
// its last reference goes, a registered block keeps its KV and joins an LRU list of evictable
// blocks instead of the plain free list; allocate() takes plain free blocks first and evicts the
// least recently freed cached block only when none is left (eviction unregisters it).
//
// The hash only finds a candidate. match() accepts it only if the block's stored token ids equal
// the request's and its recorded parent is exactly the block matched one level up, in the same
// allocation generation (a reallocated parent bumps its generation, so a child computed on top of
// old contents can never match). By induction a matched chain holds KV computed from exactly the
// request's prefix, so a 64-bit hash collision costs a cache miss, never wrong output.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace mx::runtime {

// Hash of one full block given its parent's hash (kRootHash for the first block).
using BlockHashFn = uint64_t (*)(uint64_t parent, std::span<const int32_t> tokens);
uint64_t default_block_hash(uint64_t parent, std::span<const int32_t> tokens);
inline constexpr uint64_t kRootHash = 0x6d78736572766531ull;  // "mxserve1"

class BlockPool {
 public:
  // hash == nullptr: default_block_hash (tests pass a weak one to force collisions).
  explicit BlockPool(int num_blocks, int block_size = 16, bool enable_caching = false, BlockHashFn hash = nullptr);
  int num_blocks() const { return int(ref_.size()); }
  int block_size() const { return block_size_; }
  bool caching() const { return caching_; }
  // Allocatable blocks: plain free ones plus cached blocks nobody references.
  int num_free() const { return int(free_.size() + lru_.size()); }
  int num_cached() const { return int(cached_.size()); }
  // Returns -1 when no block is free (the caller preempts).
  int32_t allocate();
  void add_ref(int32_t block);  // also takes a cached block with no references off the LRU list
  void release(int32_t block);  // at 0: cached blocks to the LRU tail, others to the free list
  int ref_count(int32_t block) const { return ref_[size_t(block)]; }

  uint64_t hash(uint64_t parent, std::span<const int32_t> tokens) const { return hash_(parent, tokens); }
  // Longest chain of cached blocks holding `tokens` from position 0, at most max_blocks; takes a
  // reference on each. `hashes` receives the chain hashes of the matched blocks.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int max_blocks, std::vector<uint64_t>& hashes);
  // The cached block registered under `hash` whose kind (a full-layer or a sliding-layer block),
  // recorded parent (same allocation generation) and token ids are exactly these, with a reference
  // taken; -1 if there is none.
  int32_t match_block(uint64_t hash, int32_t parent, std::span<const int32_t> tokens, bool sliding = false);
  // Registers a full, computed block. parent = the full-layer block before it in the sequence (-1 for
  // the first), also for a sliding-layer block. A hash already registered keeps its block (a
  // duplicate is simply not cached).
  void register_block(int32_t block, uint64_t hash, int32_t parent, std::span<const int32_t> tokens,
                      bool sliding = false);

 private:
  struct Meta {
    uint64_t hash = 0;
    bool registered = false;
    bool sliding = false;                  // a sliding-window layers' block
    int32_t parent = -1;
    uint64_t parent_gen = 0;
    uint64_t gen = 0;                      // bumped on every allocation
    std::vector<int32_t> tokens;           // the block's token ids, for the collision check
    std::list<int32_t>::iterator lru_pos;  // valid while on lru_
  };
  void unregister(int32_t block);

  int block_size_;
  bool caching_;
  BlockHashFn hash_;
  std::vector<int> ref_;
  std::vector<Meta> meta_;
  std::vector<int32_t> free_;        // LIFO: recently freed uncached blocks are reused first
  std::list<int32_t> lru_;           // cached blocks with no references, least recently freed first
  std::unordered_map<uint64_t, int32_t> cached_;
};

}  // namespace mx::runtime
