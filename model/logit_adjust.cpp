#include "model/logit_adjust.h"

#include <algorithm>
#include <limits>

#include "core/parallel.h"

namespace mx {

LogitAdjustBuilder::Acc& LogitAdjustBuilder::at(int32_t id) {
  int32_t& k = at_[size_t(id)];
  if (k == 0) {
    row_.push_back({id, 0.f, 1.f, 0});
    k = int32_t(row_.size());
  }
  return row_[size_t(k - 1)];
}

bool LogitAdjustBuilder::add_row(int row, const SeqStep& q, LogitAdjustEntry* out, int& n, int cap) {
  const int vocab = int(at_.size());
  auto valid = [&](int32_t id) { return id >= 0 && id < vocab; };
  row_.clear();
  // adjust_row_logits' order: the bias, then the ban (which absorbs it), then the penalties.
  for (const LogitBias& b : q.logit_bias)
    if (valid(b.id)) at(b.id).add += b.bias;
  for (int32_t id : q.banned)
    if (valid(id)) at(id).add = -std::numeric_limits<float>::infinity();
  const SamplingParams& p = q.sampling;
  if (p.penalized()) {
    const int prompt_len = std::clamp(q.prompt_len, 0, int(q.history.size()));
    const bool rep = p.repetition_penalty != 1.f, counts = p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
    for (int i = rep ? 0 : prompt_len; i < int(q.history.size()); ++i) {  // without repetition: the output only
      const int32_t id = q.history[size_t(i)];
      if (!valid(id)) continue;
      Acc& a = at(id);
      if (rep) a.rep = p.repetition_penalty;
      if (counts && i >= prompt_len) ++a.count;
    }
  }
  const bool fits = n + int(row_.size()) <= cap;
  for (const Acc& a : row_) {
    at_[size_t(a.id)] = 0;
    if (!fits) continue;
    // The host's expression, so the subtraction is the same float.
    const float sub = a.count > 0 ? p.frequency_penalty * float(a.count) + p.presence_penalty : 0.f;
    out[n++] = {row, a.id, a.add, a.rep, sub};
  }
  return fits;
}

void LogitAdjustList::begin(LogitAdjustEntry* out, int cap) {
  out_ = out;
  cap_ = cap;
  n_ = reserved_ = 0;
  pending_.clear();
}

bool LogitAdjustList::add(int row, const SeqStep& q) {
  if (q.sampling.penalized()) {  // at most an entry an id it names: reserve that many, build at finish()
    const int bound = int(q.history.size() + q.logit_bias.size() + q.banned.size());
    if (n_ + reserved_ + bound <= cap_) {
      reserved_ += bound;
      pending_.push_back({row, &q});
      return true;
    }
  }
  return now_.add_row(row, q, out_, n_, cap_ - reserved_);
}

int LogitAdjustList::finish() {
  const int rows = int(pending_.size());
  // A part a ~8,000 history tokens (~0.1 ms of one thread), at most one a thread.
  const int parts = std::clamp(std::min(reserved_ / 8192, rows), 1, pool_.size());
  if (parts == 1) {
    for (const Pending& p : pending_) now_.add_row(p.row, *p.q, out_, n_, cap_);  // fits: reserved
  } else {
    while (int(part_builders_.size()) < parts) part_builders_.push_back(std::make_unique<LogitAdjustBuilder>(vocab_));
    part_entries_.resize(size_t(std::max<size_t>(part_entries_.size(), size_t(parts))));
    pool_.parallel_for(parts, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        std::vector<LogitAdjustEntry>& v = part_entries_[size_t(k)];
        int bound = 0, n = 0;
        for (int i = int(rows * k / parts); i < int(rows * (k + 1) / parts); ++i) {
          const SeqStep& q = *pending_[size_t(i)].q;
          bound += int(q.history.size() + q.logit_bias.size() + q.banned.size());
        }
        v.resize(size_t(bound));
        for (int i = int(rows * k / parts); i < int(rows * (k + 1) / parts); ++i)
          part_builders_[size_t(k)]->add_row(pending_[size_t(i)].row, *pending_[size_t(i)].q, v.data(), n, bound);
        v.resize(size_t(n));
      }
    });
    std::vector<int> at(size_t(parts) + 1, n_);
    for (int k = 0; k < parts; ++k) at[size_t(k) + 1] = at[size_t(k)] + int(part_entries_[size_t(k)].size());
    pool_.parallel_for(parts, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k)
        std::copy(part_entries_[size_t(k)].begin(), part_entries_[size_t(k)].end(), out_ + at[size_t(k)]);
    });
    n_ = at[size_t(parts)];
  }
  pending_.clear();
  reserved_ = 0;
  return n_;
}

void apply_logit_adjustments(float* logits, int stride, int id0, int n_ids, std::span<const LogitAdjustEntry> entries,
                             int s0, int S) {
  for (const LogitAdjustEntry& e : entries) {
    const int s = e.row - s0, id = e.id - id0;
    if (s < 0 || s >= S || id < 0 || id >= n_ids) continue;
    float& x = logits[size_t(s) * size_t(stride) + size_t(id)];
    float l = x;
    if (e.add != 0.f) l = l + e.add;
    if (e.rep != 1.f) l = l > 0.f ? l / e.rep : l * e.rep;
    if (e.sub != 0.f) l = l - e.sub;
    x = l;
  }
}

}  // namespace mx
