#include "model/step_wire.h"

#include <cstring>

#include "core/error.h"

namespace mx {
namespace {

constexpr uint32_t kMagic = 0x7473786d;  // "mxst"

// The fixed part of one sequence; its token and block ids follow.
struct SeqHead {
  int64_t seq_id;
  uint64_t seed, rng_step;
  int32_t start_pos, ntok, nbt, nsw, nban, nbias, nhist, prompt_len, top_k, top_logprobs;
  float temperature, top_p, min_p, presence, frequency, repetition;
  uint8_t sample, expect_next, logprobs, pad;
  int32_t nallow;  // 64-bit words of the allowed-token bits
  int32_t nptgt, prompt_row0, prompt_top, pad2;  // prompt log-probs (SeqStep::prompt_targets)
};
static_assert(sizeof(SeqHead) == 112, "no implicit padding: every byte sent is written");

template <class T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_ids(std::string& s, std::span<const int32_t> v) {
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

struct Reader {
  const std::string& s;
  size_t at = 0;
  void take(void* dst, size_t n) {
    if (n > s.size() - at) fail("tensor parallelism: a step message cut short ({} bytes)", s.size());
    std::memcpy(dst, s.data() + at, n);
    at += n;
  }
};

}  // namespace

void encode_step(std::span<const SeqStep> seqs, size_t num_results, std::string& out) {
  out.clear();
  put(out, kMagic);
  put(out, uint32_t(seqs.size()));
  put(out, uint64_t(num_results));
  for (const SeqStep& q : seqs) {
    const SamplingParams& p = q.sampling;
    const SeqHead h{q.seq_id, p.seed, q.rng_step, q.start_pos, int32_t(q.tokens.size()), int32_t(q.block_table.size()),
                    int32_t(q.sliding_table.size()), int32_t(q.banned.size()), int32_t(q.logit_bias.size()),
                    int32_t(q.history.size()), q.prompt_len, p.top_k, p.top_logprobs, p.temperature, p.top_p, p.min_p,
                    p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
                    uint8_t(q.sample), uint8_t(q.expect_next), uint8_t(p.logprobs), 0, int32_t(q.allowed.size()),
                    int32_t(q.prompt_targets.size()), q.prompt_row0, q.prompt_top, 0};
    put(out, h);
    put_ids(out, q.tokens);
    put_ids(out, q.block_table);
    put_ids(out, q.sliding_table);
    put_ids(out, q.banned);
    put_ids(out, q.history);
    put_ids(out, q.prompt_targets);
    out.append(reinterpret_cast<const char*>(q.logit_bias.data()), q.logit_bias.size() * sizeof(LogitBias));
    out.append(reinterpret_cast<const char*>(q.allowed.data()), q.allowed.size() * 8);
  }
}

void decode_step(const std::string& in, WireStep& out) {
  Reader r{in};
  uint32_t magic = 0, n = 0;
  uint64_t results = 0;
  r.take(&magic, 4);
  if (magic != kMagic) fail("tensor parallelism: not a step message");
  r.take(&n, 4);
  r.take(&results, 8);
  if (n > (in.size() / sizeof(SeqHead))) fail("tensor parallelism: a step message of {} sequences in {} bytes", n, in.size());
  out.num_results = results;
  out.seqs.resize(n);
  out.ints.clear();
  out.biases.clear();
  out.allowed.clear();
  std::vector<SeqHead> heads(n);  // first pass: the ids into one array, then the spans into it
  std::vector<size_t> offs(n), boffs(n), aoffs(n);
  for (uint32_t i = 0; i < n; ++i) {
    SeqHead& h = heads[i];
    r.take(&h, sizeof(h));
    if (h.ntok < 0 || h.nbt < 0 || h.nsw < 0 || h.nban < 0 || h.nbias < 0 || h.nhist < 0 || h.nallow < 0 || h.nptgt < 0)
      fail("tensor parallelism: a step message with negative sizes");
    const size_t ids = size_t(h.ntok) + size_t(h.nbt) + size_t(h.nsw) + size_t(h.nban) + size_t(h.nhist) + size_t(h.nptgt);
    if (ids > (in.size() - r.at) / 4) fail("tensor parallelism: a step message cut short ({} bytes)", in.size());
    offs[i] = out.ints.size();
    out.ints.resize(offs[i] + ids);
    r.take(out.ints.data() + offs[i], ids * 4);
    if (size_t(h.nbias) > (in.size() - r.at) / sizeof(LogitBias)) fail("tensor parallelism: a step message cut short ({} bytes)", in.size());
    boffs[i] = out.biases.size();
    out.biases.resize(boffs[i] + size_t(h.nbias));
    r.take(out.biases.data() + boffs[i], size_t(h.nbias) * sizeof(LogitBias));
    if (size_t(h.nallow) > (in.size() - r.at) / 8) fail("tensor parallelism: a step message cut short ({} bytes)", in.size());
    aoffs[i] = out.allowed.size();
    out.allowed.resize(aoffs[i] + size_t(h.nallow));
    r.take(out.allowed.data() + aoffs[i], size_t(h.nallow) * 8);
  }
  if (r.at != in.size()) fail("tensor parallelism: {} bytes after a step message", in.size() - r.at);
  for (uint32_t i = 0; i < n; ++i) {
    const SeqHead& h = heads[i];
    SeqStep& q = out.seqs[i];
    const int32_t* p = out.ints.data() + offs[i];
    q.seq_id = h.seq_id;
    q.start_pos = h.start_pos;
    q.tokens = {p, size_t(h.ntok)};
    q.block_table = {p + h.ntok, size_t(h.nbt)};
    q.sliding_table = {p + h.ntok + h.nbt, size_t(h.nsw)};
    q.banned = {p + h.ntok + h.nbt + h.nsw, size_t(h.nban)};
    q.history = {p + h.ntok + h.nbt + h.nsw + h.nban, size_t(h.nhist)};
    q.prompt_len = h.prompt_len;
    q.prompt_targets = {p + h.ntok + h.nbt + h.nsw + h.nban + h.nhist, size_t(h.nptgt)};
    q.prompt_row0 = h.prompt_row0;
    q.prompt_top = h.prompt_top;
    q.logit_bias = {out.biases.data() + boffs[i], size_t(h.nbias)};
    q.allowed = {out.allowed.data() + aoffs[i], size_t(h.nallow)};
    q.sample = h.sample != 0;
    q.expect_next = h.expect_next != 0;
    q.rng_step = h.rng_step;
    q.sampling = SamplingParams{h.temperature, h.top_p, h.top_k, h.min_p, h.seed, h.top_logprobs, h.logprobs != 0,
                                h.presence, h.frequency, h.repetition};
  }
}

}  // namespace mx
