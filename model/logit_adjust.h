// A step's logit adjustments as one list of entries, one a (sampled row, token id): what the CUDA engine
// applies to its logits before the pick, so a row with a logit_bias, banned ids or penalties samples on
// the GPU. Applied as apply_logit_adjustments does, an entry gives adjust_row_logits' logits bit for bit.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/model_runner.h"

namespace mx {

class ThreadPool;

// The device layout (five 4-byte words): the id's logit l becomes
//   l += add (its bias, -inf when banned); if (rep != 1) l = l > 0 ? l / rep : l * rep; l -= sub
// where rep is the repetition penalty of an id in the prompt or the output and sub the output's
// frequency_penalty x count + presence_penalty. add == 0 and sub == 0 leave l's bits as they are.
struct LogitAdjustEntry {
  int32_t row = 0;  // the sampled row in the step
  int32_t id = 0;
  float add = 0.f, rep = 1.f, sub = 0.f;
};
static_assert(sizeof(LogitAdjustEntry) == 20);

// Builds the entries row by row; O(history + biases + bans) a row, no sort.
class LogitAdjustBuilder {
 public:
  explicit LogitAdjustBuilder(int vocab) : at_(size_t(vocab), 0) {}
  // True when q has anything to adjust (a bias, a ban or a penalty).
  static bool needed(const SeqStep& q) { return !q.banned.empty() || !q.logit_bias.empty() || q.sampling.penalized(); }
  // Appends q's entries for sampled row `row` to out[n, cap) and advances n; when they do not fit, appends
  // nothing and returns false. Ids outside [0, vocab) are skipped, as the host skips them.
  bool add_row(int row, const SeqStep& q, LogitAdjustEntry* out, int& n, int cap);

 private:
  struct Acc {
    int32_t id;
    float add, rep;
    int count;  // in the output
  };
  Acc& at(int32_t id);
  std::vector<int32_t> at_;  // per id: its index in row_ + 1 (0 = none); reset after each row
  std::vector<Acc> row_;
};

// A step's list at out[0, cap), rows added in step order. A penalized row's ids and output counts are
// kept per sequence across steps (a step adds the tokens its history gained), so a step writes each row's
// entries without walking its history again; those of many rows on the pool's threads at finish(). The
// pool is not used between add() and finish(). A sequence not stepped for kForgetSteps is forgotten (its
// counts rebuilt if it comes back).
class LogitAdjustList {
 public:
  static constexpr int kForgetSteps = 256;
  LogitAdjustList(int vocab, ThreadPool& pool) : vocab_(vocab), pool_(pool), now_(vocab) {}
  void begin(LogitAdjustEntry* out, int cap);
  // Reserves or appends row `row`'s entries; false when they do not fit what is left (the row samples on
  // the host, nothing of it in the list). q must stay valid until finish().
  bool add(int row, const SeqStep& q);
  int finish();  // builds the reserved rows; returns the list's entries
  size_t sequences_kept() const { return seqs_.size(); }

 private:
  struct IdCount {
    int32_t id;
    int32_t count;  // in the output; 0: a prompt id (kept for the repetition penalty only)
  };
  // One sequence's distinct ids, sorted, as of its first `consumed` history tokens.
  struct SeqIds {
    std::vector<IdCount> ids;
    int consumed = 0, prompt_len = 0;
    int32_t last = -1;     // history[consumed - 1]
    bool prompt = false;   // prompt ids kept (a repetition penalty)
    uint64_t used = 0;     // the step that last used it
  };
  struct Pending {
    int row;
    const SeqStep* q;
    SeqIds* seq;
    int size = 0, at = 0;                  // entries, and where they go
    std::vector<LogitAdjustEntry> extra;   // biases and bans, merged an id
  };
  static bool counted(const SeqIds& seq, const SeqStep& q);  // seq counted a prefix of q's history
  void update(SeqIds& seq, const SeqStep& q, std::vector<uint64_t>& scratch) const;
  void extras(Pending& p) const;
  void emit(const Pending& p) const;
  int vocab_;
  ThreadPool& pool_;
  LogitAdjustBuilder now_;
  LogitAdjustEntry* out_ = nullptr;
  int cap_ = 0, n_ = 0, reserved_ = 0, npending_ = 0;
  uint64_t step_ = 0;
  std::vector<Pending> pending_;  // [0, npending_) this step's (kept beyond for their buffers)
  std::unordered_map<int64_t, SeqIds> seqs_;
  std::vector<std::vector<uint64_t>> scratch_;  // a part's sort buffer
};

// The CPU reference of the device kernel: entries of rows [s0, s0 + S) applied to logits[(row - s0) *
// stride + id - id0] for ids in [id0, id0 + n_ids) (a tensor-parallel rank's vocabulary slice).
void apply_logit_adjustments(float* logits, int stride, int id0, int n_ids, std::span<const LogitAdjustEntry> entries,
                             int s0, int S);

}  // namespace mx
