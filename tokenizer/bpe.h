// Byte-level BPE model: vocab (raw bytes <-> id) and ranked merges, as Hugging Face's BPE model
// applies them (lowest merge rank first, leftmost on ties; with ignore_merges a pre-token that is
// itself in the vocab is taken whole). Immutable after build(); const methods are thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mx::tok {

class BpeModel {
 public:
  // tokens[id] = raw bytes of id (empty for ids that are not in the vocab).
  // merges = (left bytes, right bytes) in rank order. Throws mx::Error naming `source`.
  void build(std::vector<std::string> tokens,
             const std::vector<std::pair<std::string_view, std::string_view>>& merges, bool ignore_merges,
             const std::string& source);

  int32_t lookup(std::string_view bytes) const;  // -1 when absent
  const std::string& bytes_of(int32_t id) const { return tokens_[size_t(id)]; }
  size_t size() const { return tokens_.size(); }

  // Appends the ids of one pre-token.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // The two merge strategies encode_piece picks between by length (exposed for tests).
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view piece, std::vector<int32_t>& out) const;
  static constexpr size_t kSmallPiece = 48;

 private:
  static constexpr uint64_t kNoMerge = ~0ull;
  // (rank << 32 | new_id) for the pair (a, b), or kNoMerge.
  uint64_t merge_of(int32_t a, int32_t b) const;
  void insert_token(int32_t id, const std::string& source);
  void insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id);

  std::vector<std::string> tokens_;
  // Open-addressing tables (linear probing, power-of-two capacity).
  struct VocabSlot {
    uint32_t hash;
    int32_t id;  // -1 = empty
  };
  std::vector<VocabSlot> vocab_;
  std::vector<uint64_t> merge_keys_;  // (a << 32 | b); kNoMerge = empty
  std::vector<uint64_t> merge_vals_;
  uint64_t vocab_mask_ = 0, merge_mask_ = 0;
  int32_t byte_id_[256];
  bool ignore_merges_ = false;
};

}  // namespace mx::tok
