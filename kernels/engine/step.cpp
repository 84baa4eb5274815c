// The step executor (runner.h): the step's metadata (one pinned block, one copy), its launch (small
// decode steps as captured graphs), its results, and decode ahead.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/runner.h"
#include "kernels/sampling/sample_filtered.h"
#include "kernels/sampling/token_logprobs.h"
#include "model/sampler.h"

namespace mx {
namespace {

// Sampling runs on the GPU: plain temperature in the greedy-pick kernel, top-k / top-p / min-p after
// it (kernels/sampling/sample_filtered.h), logit biases, bans (min_tokens) and penalties applied before
// both (model/logit_adjust.h); a row that asks for alternatives (top_logprobs) has them found after the
// pick (kernels/sampling/token_logprobs.h). Rows whose adjustments do not fit the step's list sample on the
// host from the copied logits; the rest of the greedy rows take the greedy-pick kernel's pick. Constrained rows (structured output's allowed ids) are masked after the
// adjustments (StepMeta::mask), up to MemoryPlan::kMaskRows a step; the rest sample on the host.
static_assert(sizeof(LogitAdjustEntry) == 4 * cuda::kAdjustWords, "StepMeta::adj holds LogitAdjustEntry words");

bool gpu_filters(const SamplingParams& p) { return p.top_k > 0 || p.top_p < 1.f || p.min_p > 0.f; }

bool same_sampling(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_p == b.top_p && a.top_k == b.top_k && a.min_p == b.min_p &&
         a.seed == b.seed && a.top_logprobs == b.top_logprobs && a.logprobs == b.logprobs &&
         a.presence_penalty == b.presence_penalty && a.frequency_penalty == b.frequency_penalty &&
         a.repetition_penalty == b.repetition_penalty;
}

// The launches `enqueue` makes on stream s, captured and instantiated. A throw inside the capture ends
// it first, so the stream runs what comes after again.
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t s, F&& enqueue) {
  cudaGraph_t g = nullptr;
  MX_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    (void)cudaGetLastError();  // the capture's error, if it was invalidated: not the next launch's
    throw;
  }
  MX_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  MX_CUDA(e);
  return exec;
}

// A token_logprobs result's `top` best (id, log-prob) pairs: words 2 + 2k (the id's bits) and 3 + 2k.
void read_top_ids(const float* o, int top, std::vector<std::pair<int32_t, float>>& dst) {
  dst.resize(size_t(top));
  for (int k = 0; k < top; ++k) {
    std::memcpy(&dst[size_t(k)].first, o + 2 + 2 * k, 4);
    dst[size_t(k)].second = o[3 + 2 * k];
  }
}

}  // namespace

void CudaRunner::step(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  MX_CHECK(out.size() == seqs.size(), "step: out.size() {} != seqs.size() {}", out.size(), seqs.size());
  const StepPlan* pl = nullptr;
  // Each of seqs' sampled row in the step that runs it (the next step's picks are read from there).
  pick_row_.resize(seqs.size());
  std::iota(pick_row_.begin(), pick_row_.end(), 0);
  bool fewer = false;
  if (ahead_.active && ahead_rows(seqs)) {
    pl = &plans_[ahead_.parity];  // already on the GPU, maybe with rows since ended (their results go unread)
    fewer = seqs.size() != ahead_.steps.size();
    if (fewer)
      for (size_t j = 0; j < ahead_.place.size(); ++j)
        if (ahead_.place[j] >= 0) pick_row_[size_t(ahead_.place[j])] = int32_t(j);
    ++ahead_.stats.used;
  } else {
    // A decode-ahead step that was not asked for finishes unread: the stream orders it before this one.
    StepPlan& p = plan_step(seqs, parity_ ^ 1, false);
    enqueue_step(p);
    pl = &p;
  }
  ahead_.active = false;
  launch_ahead(seqs, *pl);  // before waiting: the GPU goes on while the host reads the results (keeps place)
  collect_step(*pl, seqs, out, fewer ? std::span<const int32_t>(ahead_.place) : std::span<const int32_t>{});
  if (ahead_.active)
    for (size_t k = 0; k < ahead_.from.size(); ++k) ahead_.fed[k] = out[size_t(ahead_.from[k])].token;
}

StepPlan& CudaRunner::plan_step(std::span<const SeqStep> seqs, int parity, bool device_tokens) {
  StepPlan& pl = plans_[parity];
  // The copy of this host buffer's last step must have left it (a decode-ahead step may still be queued).
  MX_CUDA(cudaEventSynchronize(copied_[parity]));
  pl.M = pl.S = pl.nbt = pl.n_decode = 0;
  pl.parity = parity;
  pl.nadj = pl.nmask = 0;
  pl.filters = pl.need_logits = pl.graph = pl.wide_graph = pl.attn_long = false;
  pl.sample_seq.clear();
  pl.host_pick.clear();
  pl.layout.clear();
  pl.prompt.clear();
  pl.tops.clear();
  int nprompt = 0;
  const StepMeta& h = hmeta_[parity];
  int M = 0, S = 0, nbt = 0, n_decode = 0, nmask = 0;
  adjust_.begin(reinterpret_cast<LogitAdjustEntry*>(h.adj + 1), plan_.adj_cap());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    const int n = int(q.tokens.size());
    if (n == 0) continue;
    if (M + n > plan_.T) fail("step has more than max_tokens_per_step={} tokens", plan_.T);
    if (S >= plan_.S && q.sample) fail("step samples more than max_num_seqs={} sequences", plan_.S);
    if (q.start_pos < 0 || q.start_pos + n > opt_.max_model_len)
      fail("sequence {} positions [{}, {}) exceed max_model_len {}", q.seq_id, q.start_pos, q.start_pos + n,
           opt_.max_model_len);
    const int need = (q.start_pos + n + opt_.block_size - 1) / opt_.block_size;
    const bool sw = kv_.sliding_window > 0;
    if (nbt + need * (sw ? 2 : 1) > plan_.bt_cap) fail("step block tables exceed {} entries", plan_.bt_cap);
    if (int(q.block_table.size()) < need)
      fail("sequence {} block table covers {} blocks, needs {}", q.seq_id, q.block_table.size(), need);
    for (int b = 0; b < need; ++b)
      if (q.block_table[b] < 0 || q.block_table[b] >= kv_.num_blocks)
        fail("block id {} out of range [0, {})", q.block_table[b], kv_.num_blocks);
    std::memcpy(h.bt + nbt, q.block_table.data(), size_t(need) * 4);
    const int bt_sw = sw ? nbt + need : nbt;
    if (sw) {
      if (int(q.sliding_table.size()) < need)
        fail("sequence {} sliding block table covers {} blocks, needs {}", q.seq_id, q.sliding_table.size(), need);
      // Entries before the window are never read; keep them in range anyway.
      const int first = sliding_first_block(kv_shape(), q.start_pos);
      for (int b = 0; b < need; ++b) {
        const int32_t v = q.sliding_table[b];
        if (b >= first && (v < 0 || v >= kv_.num_blocks))
          fail("sliding block id {} out of range [0, {})", v, kv_.num_blocks);
        h.bt[bt_sw + b] = b >= first ? v : 0;
      }
    }
    for (int j = 0; j < n; ++j) {
      const int p = q.start_pos + j;
      const int32_t t = q.tokens[j];
      if ((t < 0 && !device_tokens) || t >= cfg_.vocab_size)
        fail("token id {} out of range [0, {})", t, cfg_.vocab_size);
      h.tok[M + j] = t;
      h.pos[M + j] = p;
      h.slot[M + j] = q.block_table[p / opt_.block_size] * opt_.block_size + p % opt_.block_size;
      h.slot_sw[M + j] =
          sw ? q.sliding_table[p / opt_.block_size] * opt_.block_size + p % opt_.block_size : h.slot[M + j];
      h.bt_off[M + j] = nbt;
      h.bt_off_sw[M + j] = bt_sw;
    }
    for (int j = 0; j < n; ++j)
      if (n == 1 || !opt_.flash_prefill_attention) h.decode_rows[n_decode++] = M + j;
    if (!q.prompt_targets.empty()) {
      const int np = int(q.prompt_targets.size());
      if (q.prompt_row0 < 0 || q.prompt_row0 + np > n || q.prompt_top < 0 || q.prompt_top > cuda::kTokenLogprobMaxTop)
        fail("sequence {}: prompt log-prob rows [{}, {}) of {} tokens, top {}", q.seq_id, q.prompt_row0,
             q.prompt_row0 + np, n, q.prompt_top);
      pl.prompt.push_back({int(i), M + q.prompt_row0, np, q.prompt_top, nprompt});
      std::memcpy(prompt_targets_ + nprompt, q.prompt_targets.data(), size_t(np) * 4);
      nprompt += np;
    }
    pl.layout.push_back({M, n, nbt, bt_sw});
    nbt += need * (sw ? 2 : 1);
    M += n;
    if (q.sample) {
      bool host = false;
      if (!q.allowed.empty()) {
        // Masked on the GPU after the adjustments; with bans (which could leave no allowed id: the host
        // then leaves the row unmasked) or past the slots, on the host.
        host = !q.banned.empty() || nmask == plan_.mask_slots();
        if (!host) mask_row(h, nmask++, S, q.allowed);
      }
      if (!host && LogitAdjustBuilder::needed(q))
        host = !adjust_.add(S, q);
      pl.host_pick.push_back(host);
      pl.need_logits |= host;
      if (!host && q.sampling.top_logprobs > 0) {
        if (q.sampling.top_logprobs > cuda::kTokenLogprobMaxTop)
          fail("sequence {}: top_logprobs {} is more than {}", q.seq_id, q.sampling.top_logprobs, cuda::kTokenLogprobMaxTop);
        top_rows_[pl.tops.size()] = S;
        pl.tops.push_back({S, q.sampling.top_logprobs});
      }
      const bool gpu_samples = !host && q.sampling.temperature > 0.f;
      h.srow[S] = M - 1;
      h.srow_local[S] = (M - 1) % cuda::kDecodeMaxTokens;
      h.inv_temp[S] = gpu_samples ? 1.0f / q.sampling.temperature : 0.0f;
      h.sample_key[S] = sample_stream_key(q.sampling.seed, q.rng_step);
      const bool f = gpu_samples && gpu_filters(q.sampling);
      h.top_k[S] = f ? q.sampling.top_k : 0;
      h.top_p[S] = f ? q.sampling.top_p : 1.f;
      h.min_p[S] = f ? q.sampling.min_p : 0.f;
      pl.filters |= f;
      ++S;
      pl.sample_seq.push_back(int(i));
    }
  }
  // Each prompt row's index in the rows its forward leaves: the step's, or its 8-token chunk's (decode path).
  for (const StepPlan::PromptRows& q : pl.prompt)
    for (int j = 0; j < q.n; ++j) prompt_rows_[q.first + j] = decode_path(M) ? (q.row + j) % cuda::kDecodeMaxTokens : q.row + j;
  const int nadj = adjust_.finish();
  pl.M = M; pl.S = S; pl.nbt = nbt; pl.n_decode = n_decode; pl.nadj = nadj; pl.nmask = nmask;
  h.adj[0] = nadj;
  h.mask[0] = nmask;
  int max_pos = 0;
  for (int i = 0; i < M; ++i) max_pos = std::max(max_pos, h.pos[i]);
  pl.attn_long = max_pos + 1 > cuda::attention_decode_mma_max_keys();
  pl.need_logits |= opt_.keep_logits;
  bool identity = S == M;
  for (int s = 0; identity && s < S; ++s) identity = h.srow[s] == s;
  // A step with prompt log-prob rows runs eager (none is captured), so nothing is enqueued ahead of it.
  identity = identity && pl.prompt.empty();
  pl.graph = identity && M > 0 && M <= cuda::kDecodeMaxTokens && M < opt_.prefill_min_tokens && opt_.use_graphs &&
             !probe_.profiling;
  pl.wide_graph = identity && M > 0 && n_decode == M && !pl.graph && !decode_path(M) && opt_.use_graphs &&
                  !probe_.profiling;
  // Padded on one GPU only until a TensorParallel case pads (every rank would plan the same rows).
  if (pl.wide_graph && opt_.tp.size == 1) pad_wide_step(pl);
  return pl;
}

// Slot `slot` of the step's masks: sampled row `row`'s allowed bits as uint32 words (each uint64 word's
// halves, low first on this little-endian host: bit id % 32 of word id / 32).
void CudaRunner::mask_row(const StepMeta& h, int slot, int row, std::span<const uint64_t> allowed) const {
  const int words = plan_.mask_words;
  h.mask[1 + slot] = row;
  uint32_t* bits = reinterpret_cast<uint32_t*>(h.mask + 1 + plan_.mask_slots()) + size_t(slot) * words;
  const size_t n = std::min(allowed.size() * 2, size_t(words));
  std::memcpy(bits, allowed.data(), n * 4);
  std::fill(bits + n, bits + words, 0u);
}

// A wide graph step's rows rounded up to a multiple of kWideGraphRows, so steps whose batch moves by a few
// rows share a graph. A padding row is token 0 at position 0 in the scratch block (no sequence's), picked
// greedily into a result slot nobody reads. Unpadded where the step's buffers have no room.
void CudaRunner::pad_wide_step(StepPlan& pl) {
  const int M = (pl.M + kWideGraphRows - 1) / kWideGraphRows * kWideGraphRows, pad = M - pl.M;
  const bool sw = kv_.sliding_window > 0;
  if (pad == 0 || pl.M < kWideGraphPadFrom || M > plan_.T || pl.S + pad > plan_.S || pl.n_decode + pad > plan_.attn_rows ||
      pl.nbt + (sw ? 2 : 1) > plan_.bt_cap)
    return;
  const StepMeta& h = hmeta_[pl.parity];
  const int sb = kv_.scratch_block, bt_sw = sw ? pl.nbt + 1 : pl.nbt;
  h.bt[pl.nbt] = sb;
  h.bt[bt_sw] = sb;
  for (int r = pl.M; r < M; ++r) {
    h.tok[r] = 0;
    h.pos[r] = 0;
    h.slot[r] = h.slot_sw[r] = sb * opt_.block_size;
    h.bt_off[r] = pl.nbt;
    h.bt_off_sw[r] = bt_sw;
    h.decode_rows[pl.n_decode++] = r;
    const int s = pl.S++;  // == r: the step stays an identity of rows and picks
    h.srow[s] = r;
    h.srow_local[s] = r % cuda::kDecodeMaxTokens;
    h.inv_temp[s] = 0.f;
    h.sample_key[s] = 0;
    h.top_k[s] = 0;
    h.top_p[s] = 1.f;
    h.min_p[s] = 0.f;
  }
  pl.nbt += sw ? 2 : 1;
  pl.M = M;
}

StepView CudaRunner::view(const StepPlan& pl) const {
  StepView v;
  v.dev = &dmeta_[pl.parity];
  v.host = &hmeta_[pl.parity];
  v.results = res_dev_ + size_t(pl.parity) * 2 * plan_.S;
  v.num_sampled = pl.S;
  v.attn_long = pl.attn_long;
  v.full_logits = full_logits(pl);
  v.adjust = pl.adjusts();
  v.mask_slots = plan_.mask_slots();
  v.mask_words = plan_.mask_words;
  return v;
}

void CudaRunner::enqueue_step(const StepPlan& pl) {
  const int M = pl.M, S = pl.S;
  parity_ = pl.parity;
  std::optional<WideGraphKey> capture_behind;
  if (M > 0) {
    const StepMeta& h = hmeta_[pl.parity];
    const StepMeta& d = dmeta_[pl.parity];
    const StepView st = view(pl);
    // Metadata arrays sit at fixed offsets; the block tables follow. One copy, into this parity's device
    // buffer once the last step that read it has finished, on the copy stream: the step waits for the
    // copy, not for a copy queued behind the step before it.
    MX_CUDA(cudaStreamWaitEvent(copy_stream_, done_[pl.parity], 0));
    MX_CUDA(cudaMemcpyAsync(d.tok, h.tok, size_t(plan_.meta_tail() + pl.nbt) * 4, cudaMemcpyHostToDevice,
                            copy_stream_));
    if (pl.adjusts()) {  // both counts, since the step's launches read both
      MX_CUDA(cudaMemcpyAsync(d.adj, h.adj, (1 + cuda::kAdjustWords * size_t(pl.nadj)) * 4, cudaMemcpyHostToDevice,
                              copy_stream_));
      const size_t slots = size_t(plan_.mask_slots());
      MX_CUDA(cudaMemcpyAsync(d.mask, h.mask, (1 + slots + size_t(pl.nmask) * plan_.mask_words) * 4,
                              cudaMemcpyHostToDevice, copy_stream_));
    }
    MX_CUDA(cudaEventRecord(copied_[pl.parity], copy_stream_));
    MX_CUDA(cudaStreamWaitEvent(stream_, copied_[pl.parity], 0));
    MX_CUDA(cudaEventRecord(began_[pl.parity], stream_));
    probe_.begin_step(stream_);
    if (!decode_path(M) && pl.n_decode > plan_.attn_rows)
      fail("step has {} single-token rows, more than max_num_seqs={} allows", pl.n_decode, plan_.S);
    if (pl.graph) {
      run_decode_graph(pl);
    } else if (pl.wide_graph) {
      capture_behind = run_wide_step(pl, st);
    } else if (decode_path(M)) {
      // Chunks of 8 tokens in step order: a sequence's tokens stay in position order, so a chunk
      // sees the KV of the chunks before it.
      int s = 0;
      for (int t0 = 0; t0 < M; t0 += cuda::kDecodeMaxTokens) {
        const int m = std::min(cuda::kDecodeMaxTokens, M - t0);
        int s1 = s;
        while (s1 < S && h.srow[s1] < t0 + m) ++s1;
        forward_->decode(st, t0, m, s, s1 - s, false);
        enqueue_prompt_logprobs(pl, cuda::decode_step_output(act_.xa, act_.xb, model_.shape.layers), act_.ysl, t0, m);
        s = s1;
      }
    } else {
      forward_->prefill(st, M, S, pl.layout, pl.n_decode);
      enqueue_prompt_logprobs(pl, act_.xa, nullptr, 0, M);
    }
    MX_CUDA(cudaGetLastError());
    if (pl.filters) {  // outside the decode graphs: steps without filters pay nothing
      cuda::SampleFilterParams f;
      f.logits = act_.logits; f.stride = cfg_.vocab_size; f.V = vocab_limit_; f.S = S;
      f.inv_temp = d.inv_temp; f.keys = d.sample_key; f.top_k = d.top_k; f.top_p = d.top_p;
      f.min_p = d.min_p; f.tok = reinterpret_cast<int32_t*>(st.results); f.logprob = st.results + S;
      cuda::sample_filtered(f, stream_);
    }
    if (!pl.tops.empty()) {  // the alternatives of the rows that ask for them, after the pick
      cuda::TokenLogprobParams p;
      p.logits = act_.logits; p.stride = cfg_.vocab_size; p.V = vocab_limit_; p.rows = int(pl.tops.size());
      p.targets = reinterpret_cast<const int32_t*>(st.results); p.row_index = top_rows_dev_; p.out = top_res_dev_;
      for (const auto& [row, top] : pl.tops) p.top = std::max(p.top, top);
      cuda::token_logprobs(p, stream_);
    }
    if (S > 0 && pl.need_logits)
      MX_CUDA(cudaMemcpyAsync(host_logits_, act_.logits, size_t(S) * cfg_.vocab_size * 4, cudaMemcpyDeviceToHost,
                              stream_));
    MX_CUDA(cudaEventRecord(ended_[pl.parity], stream_));
  }
  MX_CUDA(cudaEventRecord(done_[pl.parity], stream_));
  enqueued_at_[pl.parity] = StepWait::Clock::now();
  // While the GPU runs the step: launches queued before a capture begins run on, so it costs the GPU nothing.
  if (capture_behind) capture_wide_step(pl, *capture_behind);
}

// The prompt rows of step rows [t0, t0 + m) (consecutive entries: they are numbered in row order), across
// sequences, prompt_rows at a time: each launch reads the whole lm_head, so short prompts share them. A launch
// finds the most alternatives any of its rows asks for (collect_step keeps each row's own).
void CudaRunner::enqueue_prompt_logprobs(const StepPlan& pl, const float* x, const float* y_slot, int t0, int m) {
  int k0 = -1, k1 = -1, top = 0;
  for (const StepPlan::PromptRows& q : pl.prompt) {
    const int lo = std::max(q.row, t0), hi = std::min(q.row + q.n, t0 + m);
    if (lo >= hi) continue;
    if (k0 < 0) k0 = q.first + (lo - q.row);
    k1 = q.first + (hi - q.row);
    top = std::max(top, q.top);
  }
  // (The decode path's rows are normed from ysl, which the launch's logits overwrite: one launch, 8 rows at most.)
  if (y_slot && k1 - k0 > plan_.prompt_rows) fail("{} prompt rows in one decode chunk", k1 - k0);
  for (int k = k0; k >= 0 && k < k1; k += plan_.prompt_rows) {
    const int n = std::min(plan_.prompt_rows, k1 - k);
    forward_->row_logits(x, y_slot, prompt_rows_dev_ + k, n, act_.prompt_logits);
    cuda::TokenLogprobParams p;
    p.logits = act_.prompt_logits; p.stride = cfg_.vocab_size; p.V = vocab_limit_; p.rows = n;
    p.targets = prompt_targets_dev_ + k; p.top = top; p.out = prompt_res_dev_ + size_t(k) * cuda::kTokenLogprobFloats;
    cuda::token_logprobs(p, stream_);
  }
}

// Graph steps are short and run ahead: they spin. Longer steps sleep first, in slices that look at the
// event, so a wrong estimate costs at most a slice (step_wait.h).
void CudaRunner::wait_step(const StepPlan& pl) {
  using Clock = StepWait::Clock;
  const Clock::time_point t0 = enqueued_at_[pl.parity], wake = wait_.wake_at(pl.M, t0);
  bool late = false;
  if (!pl.graph && pl.M > 0)
    for (Clock::time_point now = Clock::now(); now < wake && !late; now = Clock::now()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(wake - now, StepWait::kSlice));
      const cudaError_t q = cudaEventQuery(done_[pl.parity]);
      late = q == cudaSuccess;
      if (q == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: keep it out of the next check
    }
  MX_CUDA(cudaEventSynchronize(done_[pl.parity]));
  if (!pl.graph && pl.M > 0) wait_.record(pl.M, Clock::now() - t0, late);
  // A step enqueued ahead starts now, not when it was enqueued: its wait is timed from here.
  if (ahead_.active) enqueued_at_[ahead_.parity] = Clock::now();
}

void CudaRunner::collect_step(const StepPlan& pl, std::span<const SeqStep> seqs, std::span<SampleResult> out,
                              std::span<const int32_t> place) {
  wait_step(pl);
  last_sampled_ = int(pl.sample_seq.size());  // a padded wide step's padding rows are sampled last
  if (pl.M == 0) return;
  float ms = 0.f;
  MX_CUDA(cudaEventElapsedTime(&ms, began_[pl.parity], ended_[pl.parity]));
  busy_s_ += 1e-3 * ms;
  if (probe_.profiling) probe_.profile = probe_.collect();
  const int S = pl.S;
  const int32_t* rtok = reinterpret_cast<const int32_t*>(host_res_) + size_t(pl.parity) * 2 * plan_.S;
  const float* rlp = reinterpret_cast<const float*>(host_res_) + size_t(pl.parity) * 2 * plan_.S + S;
  jobs_.clear();
  for (int s = 0; s < last_sampled_; ++s) {
    int i = pl.sample_seq[size_t(s)];
    if (!place.empty() && (i = place[size_t(i)]) < 0) continue;  // a row that has since ended
    const SeqStep& q = seqs[size_t(i)];
    SampleResult& r = out[size_t(i)];
    if (pl.host_pick[size_t(s)]) {
      // Penalties and adjustments past the step's list, constrained rows past the mask slots, sample on the
      // host from the copied logits (0.8 MB a row); the GPU adjusted none of a host row's logits.
      float* row = host_logits_ + size_t(s) * cfg_.vocab_size;
      adjust_row_logits(row, cfg_.vocab_size, q, penalty_scratch_);
      jobs_.push_back({row, &q.sampling, q.rng_step, &r});
    } else {
      r.token = rtok[s];
      r.logprob = rlp[s];
      r.top.clear();
    }
  }
  sample_tokens(jobs_, vocab_limit_, sample_pool_, scratch_);
  for (size_t j = 0; j < pl.tops.size(); ++j) {  // (a step with them is never one enqueued ahead)
    const auto [row, top] = pl.tops[j];
    SampleResult& r = out[size_t(pl.sample_seq[size_t(row)])];
    const float* o = top_res_ + j * cuda::kTokenLogprobFloats;
    r.logprob = o[0];  // (the same pass as the alternatives': a pick that is the best id reads the same value)
    read_top_ids(o, top, r.top);
  }
  for (const StepPlan::PromptRows& q : pl.prompt) {  // (a step with them is never one enqueued ahead)
    std::vector<TokenLogprob>& v = out[size_t(q.seq)].prompt;
    v.resize(size_t(q.n));
    for (int j = 0; j < q.n; ++j) {
      const float* o = prompt_res_ + size_t(q.first + j) * cuda::kTokenLogprobFloats;
      TokenLogprob& t = v[size_t(j)];
      t.token = prompt_targets_[q.first + j];
      t.logprob = o[0];
      std::memcpy(&t.rank, o + 1, 4);
      read_top_ids(o, q.top, t.top);
    }
  }
}

// The step enqueued ahead runs this one: its sequences, less any that have ended, in the same order, each
// fed the token the GPU picked for it, at the next position, with the same sampling and the blocks that
// step read and wrote. Sets ahead_.place: each enqueued row's index in seqs, -1 for one no longer asked for.
bool CudaRunner::ahead_rows(std::span<const SeqStep> seqs) {
  const size_t A = ahead_.steps.size();
  if (seqs.empty() || seqs.size() > A) return false;
  ahead_.place.assign(A, -1);
  const int bs = opt_.block_size;
  size_t j = 0;
  for (size_t i = 0; i < seqs.size(); ++i, ++j) {
    const SeqStep& q = seqs[i];
    while (j < A && ahead_.steps[j].seq_id != q.seq_id) ++j;
    if (j == A) return false;
    const SeqStep& a = ahead_.steps[j];
    // (A greedy row's pick does not depend on its random stream.)
    // (A row constrained now, structured output's final channel opening, was picked ahead without its mask.)
    if (q.tokens.size() != 1 || q.tokens[0] != ahead_.fed[j] || q.start_pos != a.start_pos || !q.allowed.empty() ||
        !q.sample || !same_sampling(q.sampling, a.sampling) || (q.sampling.temperature > 0.f && q.rng_step != a.rng_step) ||
        !std::equal(q.banned.begin(), q.banned.end(), a.banned.begin(), a.banned.end()) ||
        !std::equal(q.logit_bias.begin(), q.logit_bias.end(), a.logit_bias.begin(), a.logit_bias.end(),
                    [](const LogitBias& x, const LogitBias& y) { return x.id == y.id && x.bias == y.bias; }))
      return false;
    const size_t need = size_t(a.start_pos / bs + 1);
    if (q.block_table.size() < need || !std::equal(a.block_table.begin(), a.block_table.begin() + need, q.block_table.begin()))
      return false;
    if (kv_.sliding_window > 0) {
      const size_t first = size_t(sliding_first_block(kv_shape(), a.start_pos));
      if (q.sliding_table.size() < need ||
          !std::equal(a.sliding_table.begin() + first, a.sliding_table.begin() + need, q.sliding_table.begin() + first))
        return false;
    }
    ahead_.place[j] = int32_t(i);
  }
  return true;
}

// Enqueues the next step of `seqs` (just enqueued as `pl`) when it can run without the host: a graph step
// (one-token or wide) whose picks are the GPU's own (no filters, no host sampling, no logits copy). It holds
// the rows that expect a next token (a row at its last leaves now), each with its next position's blocks
// already in its tables and nothing that this step's pick changes (penalties, a mask).
void CudaRunner::launch_ahead(std::span<const SeqStep> seqs, const StepPlan& pl) {
  if (!opt_.decode_ahead || !(pl.graph || pl.wide_graph) || pl.filters || pl.need_logits || !pl.tops.empty() ||
      probe_.active())
    return;
  const int bs = opt_.block_size;
  ahead_.from.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    if (!q.sample || q.tokens.size() != 1) return;
    if (!q.expect_next) continue;
    const int next = q.start_pos + 1, b = next / bs;
    // (A penalized row's next adjustments count the token this step picks; a constrained row's mask too.)
    if (next >= opt_.max_model_len || q.sampling.penalized() || !q.allowed.empty()) return;
    if (int(q.block_table.size()) <= b || q.block_table[b] < 0 || q.block_table[b] >= kv_.num_blocks) return;
    if (kv_.sliding_window > 0 &&
        (int(q.sliding_table.size()) <= b || q.sliding_table[b] < 0 || q.sliding_table[b] >= kv_.num_blocks))
      return;
    ahead_.from.push_back(int32_t(i));
  }
  const size_t n = ahead_.from.size();
  if (n == 0) return;
  ahead_.steps.resize(n);
  ahead_.full.resize(n);
  ahead_.sliding.resize(n);
  ahead_.banned.resize(n);
  ahead_.bias.resize(n);
  ahead_.fed.assign(n, -1);
  ahead_.feed.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = size_t(ahead_.from[k]);
    const SeqStep& q = seqs[i];
    SeqStep& a = ahead_.steps[k];
    ahead_.full[k].assign(q.block_table.begin(), q.block_table.end());
    ahead_.sliding[k].assign(q.sliding_table.begin(), q.sliding_table.end());
    ahead_.banned[k].assign(q.banned.begin(), q.banned.end());
    ahead_.bias[k].assign(q.logit_bias.begin(), q.logit_bias.end());
    a = q;
    ahead_.feed[k] = -(pick_row_[i] + 1);  // the embedding reads this step's pick of the row (decode_kernels.h)
    a.tokens = std::span<const int32_t>(&ahead_.feed[k], 1);
    a.start_pos = q.start_pos + 1;
    a.block_table = ahead_.full[k];
    a.sliding_table = ahead_.sliding[k];
    a.banned = ahead_.banned[k];
    a.logit_bias = ahead_.bias[k];
    a.rng_step = q.rng_step + 1;
  }
  StepPlan& next = plan_step(ahead_.steps, pl.parity ^ 1, true);
  if (!next.graph && !next.wide_graph) return;  // (every row one sampled token: only a shape past both)
  enqueue_step(next);
  ahead_.active = true;
  ahead_.parity = next.parity;
  ++ahead_.stats.launched;
}

void CudaRunner::run_decode_graph(const StepPlan& pl) {
  cudaGraphExec_t& exec = graphs_.at(graph_key(pl));
  if (!exec)  // every token sampled: each is its sequence's only one
    exec = capture_graph(stream_, [&] { forward_->decode(view(pl), 0, pl.M, 0, pl.M, true); });
  MX_CUDA(cudaGraphLaunch(exec, stream_));
}

WideGraphKey CudaRunner::wide_key(const StepPlan& pl, const StepView& st) const {
  return {pl.M, pl.parity, pl.attn_long, full_logits(pl), pl.adjusts(), forward_->decode_row_splits(st, pl.layout, pl.n_decode)};
}

// A wide decode step: replayed where captured, else eager. Its key when its shape repeats the wide step
// before (enqueue_step then captures the same launches for the next time, behind the eager ones).
std::optional<WideGraphKey> CudaRunner::run_wide_step(const StepPlan& pl, const StepView& st) {
  const WideGraphKey k = wide_key(pl, st);
  const bool again = wide_graphs_.repeats(k);
  if (cudaGraphExec_t exec = wide_graphs_.find(k)) {
    MX_CUDA(cudaGraphLaunch(exec, stream_));
    return std::nullopt;
  }
  forward_->prefill(st, pl.M, pl.S, pl.layout, pl.n_decode);
  if (!again) return std::nullopt;
  return k;
}

void CudaRunner::capture_wide_step(const StepPlan& pl, const WideGraphKey& k) {
  const StepView st = view(pl);
  wide_graphs_.add(k, capture_graph(stream_, [&] { forward_->prefill(st, pl.M, pl.S, pl.layout, pl.n_decode); }));
}

}  // namespace mx
