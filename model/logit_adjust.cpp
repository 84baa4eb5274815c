#include "model/logit_adjust.h"

#include <algorithm>
#include <cmath>
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
  n_ = reserved_ = npending_ = 0;
  if (++step_ % kForgetSteps == 0)
    std::erase_if(seqs_, [&](const auto& kv) { return kv.second.used + kForgetSteps < step_; });
}

bool LogitAdjustList::add(int row, const SeqStep& q) {
  if (q.sampling.penalized()) {
    SeqIds& seq = seqs_[q.seq_id];
    const bool kept = seq.used != step_;  // (a sequence twice in one step: the second built now)
    const int hist = int(q.history.size());
    // At most: its kept ids and an entry a history token it has not seen, a bias and a ban.
    const int known = counted(seq, q) ? int(seq.ids.size()) + hist - seq.consumed : hist;
    const int bound = known + int(q.logit_bias.size() + q.banned.size());
    if (kept && n_ + reserved_ + bound <= cap_) {
      seq.used = step_;
      reserved_ += bound;
      if (npending_ == int(pending_.size())) pending_.emplace_back();
      Pending& p = pending_[size_t(npending_++)];
      p.row = row;
      p.q = &q;
      p.seq = &seq;
      return true;
    }
  }
  return now_.add_row(row, q, out_, n_, cap_ - reserved_);
}

// Brings seq up to q's history: the new tokens one by one, or all of them again when the history is not
// the one it counted (or much longer).
bool LogitAdjustList::counted(const SeqIds& seq, const SeqStep& q) {
  const int hist = int(q.history.size());
  return seq.prompt == (q.sampling.repetition_penalty != 1.f) && seq.prompt_len == std::clamp(q.prompt_len, 0, hist) &&
         seq.consumed <= hist && (seq.consumed == 0 || q.history[size_t(seq.consumed - 1)] == seq.last);
}

void LogitAdjustList::update(SeqIds& seq, const SeqStep& q, std::vector<uint64_t>& scratch) const {
  const bool prompt = q.sampling.repetition_penalty != 1.f;
  const int hist = int(q.history.size()), prompt_len = std::clamp(q.prompt_len, 0, hist);
  auto valid = [&](int32_t id) { return id >= 0 && id < vocab_; };
  if (!counted(seq, q) || hist - seq.consumed > 64) {  // sorted (id, output) keys, counted in runs
    scratch.clear();
    for (int i = prompt ? 0 : prompt_len; i < hist; ++i)
      if (valid(q.history[size_t(i)])) scratch.push_back(uint64_t(q.history[size_t(i)]) << 1 | uint64_t(i >= prompt_len));
    std::sort(scratch.begin(), scratch.end());
    seq.ids.clear();
    for (const uint64_t k : scratch) {
      const int32_t id = int32_t(k >> 1);
      if (seq.ids.empty() || seq.ids.back().id != id) seq.ids.push_back({id, 0});
      seq.ids.back().count += int32_t(k & 1);
    }
  } else {
    for (int i = seq.consumed; i < hist; ++i) {
      const int32_t id = q.history[size_t(i)];
      const bool out = i >= prompt_len;
      if (!valid(id) || (!out && !prompt)) continue;
      auto it = std::lower_bound(seq.ids.begin(), seq.ids.end(), id, [](const IdCount& a, int32_t b) { return a.id < b; });
      if (it == seq.ids.end() || it->id != id) it = seq.ids.insert(it, {id, 0});
      it->count += int32_t(out);
    }
  }
  seq.prompt = prompt;
  seq.prompt_len = prompt_len;
  seq.consumed = hist;
  seq.last = hist > 0 ? q.history[size_t(hist - 1)] : -1;
}

// p's biases and bans as one entry an id, in adjust_row_logits' order (a ban absorbs the bias), and its
// entry count: its kept ids and the extras' ids among none of them.
void LogitAdjustList::extras(Pending& p) const {
  const SeqStep& q = *p.q;
  p.extra.clear();
  for (const LogitBias& b : q.logit_bias)
    if (b.id >= 0 && b.id < vocab_) p.extra.push_back({p.row, b.id, b.bias, 1.f, 0.f});
  for (int32_t id : q.banned)
    if (id >= 0 && id < vocab_) p.extra.push_back({p.row, id, -std::numeric_limits<float>::infinity(), 1.f, 0.f});
  std::stable_sort(p.extra.begin(), p.extra.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  size_t m = 0;
  for (size_t i = 0; i < p.extra.size(); ++i) {
    if (m > 0 && p.extra[m - 1].id == p.extra[i].id) {
      LogitAdjustEntry& e = p.extra[m - 1];
      e.add = std::isinf(p.extra[i].add) ? p.extra[i].add : e.add + p.extra[i].add;
    } else {
      p.extra[m++] = p.extra[i];
    }
  }
  p.extra.resize(m);
  const std::vector<IdCount>& ids = p.seq->ids;
  p.size = int(ids.size());
  for (const LogitAdjustEntry& e : p.extra)
    if (!std::binary_search(ids.begin(), ids.end(), IdCount{e.id, 0}, [](const IdCount& a, const IdCount& b) { return a.id < b.id; }))
      ++p.size;
}

void LogitAdjustList::emit(const Pending& p) const {
  const SamplingParams& sp = p.q->sampling;
  const float rep = sp.repetition_penalty;
  const std::vector<IdCount>& ids = p.seq->ids;
  LogitAdjustEntry* o = out_ + p.at;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int c = ids[i].count;
    // The host's expression, so the subtraction is the same float.
    o[i] = {p.row, ids[i].id, 0.f, rep, c > 0 ? sp.frequency_penalty * float(c) + sp.presence_penalty : 0.f};
  }
  size_t k = ids.size();
  for (const LogitAdjustEntry& e : p.extra) {
    auto it = std::lower_bound(ids.begin(), ids.end(), e.id, [](const IdCount& a, int32_t b) { return a.id < b; });
    if (it != ids.end() && it->id == e.id) o[it - ids.begin()].add = e.add;
    else o[k++] = e;
  }
}

int LogitAdjustList::finish() {
  const int rows = npending_;
  // A part a ~16 rows, at most one a thread.
  const int parts = std::clamp(rows / 16, 1, pool_.size());
  if (int(scratch_.size()) < parts) scratch_.resize(size_t(parts));
  auto each = [&](auto&& fn) {
    if (parts == 1) {
      for (int i = 0; i < rows; ++i) fn(pending_[size_t(i)], scratch_[0]);
      return;
    }
    pool_.parallel_for(parts, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k)
        for (int i = int(rows * k / parts); i < int(rows * (k + 1) / parts); ++i) fn(pending_[size_t(i)], scratch_[size_t(k)]);
    });
  };
  each([&](Pending& p, std::vector<uint64_t>& scratch) {
    update(*p.seq, *p.q, scratch);
    extras(p);
  });
  for (int i = 0; i < rows; ++i) {  // within what add() reserved
    pending_[size_t(i)].at = n_;
    n_ += pending_[size_t(i)].size;
  }
  each([&](Pending& p, std::vector<uint64_t>&) { emit(p); });
  npending_ = reserved_ = 0;
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
