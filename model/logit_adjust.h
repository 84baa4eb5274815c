// A step's logit adjustments as one list of entries, one a (sampled row, token id): what the CUDA engine
// applies to its logits before the pick, so a row with a logit_bias, banned ids or penalties samples on
// the GPU. Applied as apply_logit_adjustments does, an entry gives adjust_row_logits' logits bit for bit.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
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

// A step's list at out[0, cap): rows are added in step order; a penalized row's entries (an id of its
// history each, ~1,500 at 1k/1k) are built at finish(), those of many rows on the pool's threads, so a
// step of 256 penalized rows does not wait ~4 ms for one thread. The pool is shared with the caller's
// other work and not used between add() and finish().
class LogitAdjustList {
 public:
  LogitAdjustList(int vocab, ThreadPool& pool) : vocab_(vocab), pool_(pool), now_(vocab) {}
  void begin(LogitAdjustEntry* out, int cap);
  // Reserves or appends row `row`'s entries; false when they do not fit what is left (the row samples on
  // the host, nothing of it in the list). q must stay valid until finish().
  bool add(int row, const SeqStep& q);
  int finish();  // builds the reserved rows; returns the list's entries

 private:
  struct Pending {
    int row;
    const SeqStep* q;
  };
  int vocab_;
  ThreadPool& pool_;
  LogitAdjustBuilder now_;
  LogitAdjustEntry* out_ = nullptr;
  int cap_ = 0, n_ = 0, reserved_ = 0;
  std::vector<Pending> pending_;
  std::vector<std::unique_ptr<LogitAdjustBuilder>> part_builders_;
  std::vector<std::vector<LogitAdjustEntry>> part_entries_;
};

// The CPU reference of the device kernel: entries of rows [s0, s0 + S) applied to logits[(row - s0) *
// stride + id - id0] for ids in [id0, id0 + n_ids) (a tensor-parallel rank's vocabulary slice).
void apply_logit_adjustments(float* logits, int stride, int id0, int n_ids, std::span<const LogitAdjustEntry> entries,
                             int s0, int S);

}  // namespace mx
