#include "runtime/engine.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "runtime/ngram_proposer.h"

namespace mx::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return "";
  }
}

void Channel::push(TokenEvent ev) {
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

void Channel::push_quiet(TokenEvent ev) {
  std::lock_guard lk(mu_);
  q_.push_back(std::move(ev));
}

void Channel::wake() { cv_.notify_one(); }

std::vector<TokenEvent> Channel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !q_.empty(); });
  std::vector<TokenEvent> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
  q_.clear();
  return out;
}

Waker::Waker() : thread_([this] { loop(); }) {}

Waker::~Waker() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Waker::post(std::vector<std::shared_ptr<Channel>>& chs) {
  if (chs.empty()) return;
  {
    std::lock_guard lk(mu_);
    if (pending_.empty()) pending_.swap(chs);
    else pending_.insert(pending_.end(), chs.begin(), chs.end());  // still waking the step before
  }
  chs.clear();
  cv_.notify_one();
}

void Waker::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) break;  // stopping, nothing left to wake
    work_.swap(pending_);
    lk.unlock();
    for (auto& c : work_) c->wake();
    work_.clear();
    lk.lock();
  }
}

struct Engine::Seq {
  int64_t id = 0;
  GenRequest req;
  std::shared_ptr<Channel> ch;
  std::vector<int32_t> tokens;      // prompt + generated (known tokens)
  int num_computed = 0;             // tokens whose KV is in the cache
  int generated = 0;
  std::vector<int32_t> blocks;
  // The sliding-window layers' blocks, indexed like `blocks`; -1 before the window (released) or
  // not yet allocated. Entries below sw_lo are all -1.
  std::vector<int32_t> sw_blocks;
  int sw_lo = 0;
  std::vector<uint64_t> hashes;     // chain hashes of blocks[0, hashes.size()), all in the cache
  int cached_tokens = -1;           // prefix-cache hit at first admission (-1 = not admitted yet)
  // Prompt log-probs (GenRequest::prompt_logprobs): those of positions [0, size) so far (position p
  // predicts prompt token p + 1), until they go out with the first token.
  std::vector<TokenLogprob> prompt_lp;
  bool prompt_lp_sent = false;
  bool wants_prompt_lp() const { return req.prompt_logprobs >= 0 && !prompt_lp_sent; }
  // This step's tokens when it checks drafts (EngineOptions::spec_tokens): the last token, then the drafts.
  std::vector<int32_t> spec;
  bool done = false;
};

Engine::Engine(ModelRunner& runner, const EngineOptions& opt)
    : runner_(runner), opt_(opt), kv_(runner.kv_shape()), block_size_(runner.kv_shape().block_size),
      max_model_len_(opt.max_model_len > 0 ? opt.max_model_len : runner.config().max_position_embeddings),
      pool_(runner.kv_shape().num_blocks, runner.kv_shape().block_size, opt.enable_prefix_caching, opt.block_hash) {
  MX_CHECK(block_size_ > 0, "bad KV block size {}", block_size_);
  MX_CHECK(opt_.max_num_seqs > 0 && opt_.max_num_batched_tokens > 0, "max_num_seqs and max_num_batched_tokens must be > 0");
  stats_.kv_capacity_tokens = int64_t(pool_.num_blocks()) * pool_.block_size();
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<int64_t> Engine::submit(GenRequest req, std::shared_ptr<Channel> ch) {
  MX_CHECK(req.prompt_logprobs >= -1 && req.prompt_logprobs <= kMaxPromptTop, "prompt_logprobs {} is outside [-1, {}]",
           req.prompt_logprobs, kMaxPromptTop);
  auto s = std::make_unique<Seq>();
  s->tokens = req.prompt;
  s->req = std::move(req);
  s->ch = std::move(ch);
  int64_t id;
  {
    std::lock_guard lk(mu_);
    if (draining_ || stop_) return std::nullopt;
    // The queue bound counts requests beyond the free seats: a burst of max_num_seqs requests is
    // admitted over a few steps (the token budget), not refused while seats are empty.
    const int free_seats = std::max(0, opt_.max_num_seqs - stats_.running);
    if (int(inbox_.size()) + stats_.waiting >= opt_.max_waiting + free_seats) return std::nullopt;
    id = s->id = next_id_++;
    ++active_;
    inbox_.push_back(std::move(s));
  }
  cv_.notify_all();
  return id;
}

void Engine::abort(int64_t id) {
  {
    std::lock_guard lk(mu_);
    aborts_.push_back(id);
  }
  cv_.notify_all();
}

bool Engine::draining() const {
  std::lock_guard lk(mu_);
  return draining_;
}
bool Engine::ready() const {
  std::lock_guard lk(mu_);
  return ready_;
}
EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Engine::take_inbox() {
  std::vector<int64_t> aborts;
  {
    std::lock_guard lk(mu_);
    while (!inbox_.empty()) {
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    aborts.swap(aborts_);
  }
  auto now = std::chrono::steady_clock::now();
  auto check = [&](Seq& s) {
    if (s.done) return;
    if (std::find(aborts.begin(), aborts.end(), s.id) != aborts.end() || now >= s.req.deadline) finish(s, FinishReason::kAbort);
  };
  for (auto& s : waiting_) check(*s);
  for (auto& s : running_) check(*s);
}

void Engine::free_blocks(Seq& s) {
  // Tail first: the pool evicts the least recently freed cached block first, and a chain's later
  // blocks are useless without its earlier ones. Sliding-layer blocks go first: a cached prefix is
  // only usable up to where its window's sliding blocks survive, and they are the cheaper loss.
  for (auto it = s.sw_blocks.rbegin(); it != s.sw_blocks.rend(); ++it)
    if (*it >= 0) pool_.release(*it);
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s.blocks.clear();
  s.sw_blocks.clear();
  s.sw_lo = 0;
  s.hashes.clear();
  s.num_computed = 0;
}

// The sliding layers' block of chain hash h is cached under a key of its own.
static uint64_t sliding_key(uint64_t h) { return h ^ 0x736c6964696e6721ull; }

int Engine::reuse_cached_prefix(Seq& s) {
  int max_blocks = (int(s.tokens.size()) - 1) / block_size_;  // the last token is always computed
  // Prompt log-probs come from computed rows: a cached prefix only as far as they are already known.
  if (s.wants_prompt_lp()) max_blocks = std::min(max_blocks, int(s.prompt_lp.size()) / block_size_);
  s.blocks = pool_.match(s.tokens, max_blocks, s.hashes);
  // Resuming after L blocks needs the sliding layers' blocks of the window before position L *
  // block_size too. Where one of them is gone, the prefix is cut back to that block (whose own
  // window lies further back) until the window is complete or nothing is left.
  std::span<const int32_t> toks(s.tokens);
  int L = kv_.sliding_window > 0 ? int(s.blocks.size()) : 0;
  while (L > 0) {
    s.sw_blocks.assign(size_t(L), -1);
    const int first = sliding_first_block(kv_, L * block_size_);
    s.sw_lo = first;
    int miss = -1;
    for (int i = first; i < L && miss < 0; ++i) {
      auto blk = toks.subspan(size_t(i) * size_t(block_size_), size_t(block_size_));
      const int32_t parent = i ? s.blocks[size_t(i) - 1] : -1;
      s.sw_blocks[size_t(i)] = pool_.match_block(sliding_key(s.hashes[size_t(i)]), parent, blk, true);
      if (s.sw_blocks[size_t(i)] < 0) miss = i;
    }
    if (miss < 0) break;
    for (int32_t b : s.sw_blocks)
      if (b >= 0) pool_.release(b);
    for (int i = L - 1; i >= miss; --i) pool_.release(s.blocks[size_t(i)]);
    s.blocks.resize(size_t(miss));
    s.hashes.resize(size_t(miss));
    L = miss;
  }
  if (s.blocks.empty()) {
    s.sw_blocks.clear();
    s.sw_lo = 0;
  }
  s.num_computed = int(s.blocks.size()) * block_size_;
  return s.num_computed;
}

void Engine::cache_full_blocks(Seq& s) {
  if (!pool_.caching()) return;
  const size_t full = size_t(s.num_computed / block_size_);
  std::span<const int32_t> toks(s.tokens);
  for (size_t i = s.hashes.size(); i < full; ++i) {
    auto blk = toks.subspan(i * size_t(block_size_), size_t(block_size_));
    uint64_t h = pool_.hash(i ? s.hashes.back() : kRootHash, blk);
    const int32_t parent = i ? s.blocks[i - 1] : -1;
    pool_.register_block(s.blocks[i], h, parent, blk);
    if (i < s.sw_blocks.size() && s.sw_blocks[i] >= 0)
      pool_.register_block(s.sw_blocks[i], sliding_key(h), parent, blk, true);
    s.hashes.push_back(h);
  }
}

void Engine::finish(Seq& s, FinishReason r) {
  if (s.done) return;
  s.done = true;
  free_blocks(s);
  {
    std::lock_guard lk(mu_);
    --active_;
  }
  TokenEvent ev;
  ev.finish = r;
  s.ch->push(std::move(ev));
}

void Engine::preempt(Seq& s) {
  // Recompute: drop the KV, keep the known tokens; the sequence re-prefills them later.
  free_blocks(s);
  std::lock_guard lk(mu_);
  ++stats_.preemptions;
}

bool Engine::continues(const Seq& s) const {
  return s.generated + 1 < s.req.max_tokens && int(s.tokens.size()) + 1 < max_model_len_;
}

int Engine::propose(Seq& s, int budget) {
  s.spec.clear();
  if (opt_.spec_tokens <= 0) return 0;
  const GenRequest& q = s.req;
  // Greedy rows whose pick is the raw logits' argmax, which the drafts' rows report (lowest id on ties).
  const bool plain = q.sampling.temperature == 0.f && !q.sampling.penalized() && !q.sampling.logprobs &&
                     q.sampling.top_logprobs == 0 && q.logit_bias.empty() && !q.constraint && !s.wants_prompt_lp() &&
                     (s.generated >= q.min_tokens || q.stop_token_ids.empty());
  if (!plain || int(running_.size()) > opt_.spec_max_running || !continues(s)) return 0;
  // The drafts and the token after them stay within max_tokens, max_model_len and the step's budget.
  const int k = std::min({opt_.spec_tokens, q.max_tokens - s.generated - 1, max_model_len_ - int(s.tokens.size()) - 1, budget - 1});
  if (k <= 0) return 0;
  s.spec.push_back(s.tokens.back());
  if (propose_ngram(s.tokens, k, opt_.spec_ngram_min, opt_.spec_ngram_max, s.spec) == 0) s.spec.clear();
  return int(s.spec.size()) - (s.spec.empty() ? 0 : 1);
}

bool Engine::ensure_blocks(Seq& s, int num_tokens) {
  const int need = (num_tokens + block_size_ - 1) / block_size_;
  if (kv_.sliding_window > 0) {
    // Blocks wholly before the window of the next computed position are never read again: back to
    // the pool (cached ones stay findable), before allocating.
    const int first = std::min(sliding_first_block(kv_, s.num_computed), int(s.sw_blocks.size()));
    for (; s.sw_lo < first; ++s.sw_lo) {
      int32_t& b = s.sw_blocks[size_t(s.sw_lo)];
      if (b >= 0) pool_.release(b);
      b = -1;
    }
  }
  while (int(s.blocks.size()) < need) {
    int32_t b = pool_.allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
  }
  if (kv_.sliding_window > 0) {
    if (int(s.sw_blocks.size()) < need) s.sw_blocks.resize(size_t(need), -1);
    for (int i = sliding_first_block(kv_, s.num_computed); i < need; ++i) {
      int32_t& b = s.sw_blocks[size_t(i)];
      if (b < 0 && (b = pool_.allocate()) < 0) return false;
    }
  }
  return true;
}

bool Engine::step() {
  take_inbox();
  std::erase_if(waiting_, [](auto& s) { return s->done; });
  std::erase_if(running_, [](auto& s) { return s->done; });

  // Schedule: running sequences first (decodes need 1 token; partial prefills take a chunk),
  // then admit waiting ones while budget and seats remain.
  int budget = opt_.max_num_batched_tokens;
  std::vector<std::pair<Seq*, int>>& sched = sched_;
  sched.clear();
  std::stable_sort(running_.begin(), running_.end(), [](auto& a, auto& b) {
    return (int(a->tokens.size()) - a->num_computed == 1) > (int(b->tokens.size()) - b->num_computed == 1);
  });
  // Prompt tokens this step may still take: capped once it decodes (decodes come first, by the sort).
  int decodes = 0, prefill_used = 0;
  auto prefill_room = [&] {
    const int cap = opt_.max_prefill_tokens_with_decodes;
    return decodes > 0 && cap > 0 ? std::max(0, std::min(budget, cap - prefill_used)) : budget;
  };
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq& s = *running_[i];
    const int left = int(s.tokens.size()) - s.num_computed;
    int n = std::min(left, left == 1 ? budget : prefill_room());
    if (n <= 0) continue;
    if (left == 1 && propose(s, budget) > 0) {  // (s.spec is empty outside a step that checks drafts)
      // Drafts take blocks only where the pool has them: they never preempt another sequence.
      if (ensure_blocks(s, s.num_computed + int(s.spec.size()))) n = int(s.spec.size());
      else s.spec.clear();
    }
    bool ok = ensure_blocks(s, s.num_computed + n);
    while (!ok) {
      // Preempt the most recently admitted other sequence not yet scheduled, else this one.
      Seq* victim = running_.back().get();
      if (victim == &s) break;
      preempt(*victim);
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
      ok = ensure_blocks(s, s.num_computed + n);
    }
    if (!ok) {
      preempt(s);
      waiting_.push_front(std::move(running_[i]));
      running_.erase(running_.begin() + long(i));
      break;
    }
    sched.push_back({&s, n});
    budget -= n;
    if (left == 1) ++decodes;
    else prefill_used += n;
  }
  uint64_t prompt_tokens = 0;
  while (!waiting_.empty() && prefill_room() > 0 && int(running_.size()) < opt_.max_num_seqs) {
    Seq& s = *waiting_.front();
    int hit = reuse_cached_prefix(s);
    int n = std::min(int(s.tokens.size()) - s.num_computed, prefill_room());
    if (!ensure_blocks(s, s.num_computed + n)) {
      free_blocks(s);
      break;  // wait for running sequences to finish
    }
    if (s.cached_tokens < 0) {
      // Counted once per request (not again after a preemption), like vLLM's counters.
      s.cached_tokens = hit;
      prompt_tokens += uint64_t(hit);
      std::lock_guard lk(mu_);
      stats_.prefix_cache_queries += pool_.caching() ? s.req.prompt.size() : 0;
      stats_.prefix_cache_hits += uint64_t(hit);
    }
    sched.push_back({&s, n});
    budget -= n;
    prefill_used += n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // A decoding row that goes on takes its next position's block now, while blocks are plentiful: the
  // runner may enqueue its next step before reading this one's results (decode ahead) only when the
  // next position's block is in the row's tables; otherwise every block_size-th token waits for the host.
  for (auto [s, n] : sched) {
    if (pool_.num_free() <= int(running_.size())) break;  // close to full: blocks go where they are needed
    // (Only where the next position opens a block: otherwise the step's own block holds it.)
    const bool opens = (s->num_computed + 1) % block_size_ == 0;
    const bool decodes_on = n == 1 && int(s->tokens.size()) - s->num_computed == 1 && continues(*s);
    if (opens && decodes_on) (void)ensure_blocks(*s, s->num_computed + 2);
  }

  auto publish = [&] {
    std::lock_guard lk(mu_);
    stats_.running = int(running_.size());
    stats_.waiting = int(waiting_.size());
    stats_.kv_usage = 1.0 - double(pool_.num_free()) / pool_.num_blocks();
    stats_.cached_blocks = pool_.num_cached();
  };
  if (sched.empty()) {
    if (!waiting_.empty() && running_.empty()) {
      // Nothing fits even alone: the request can never run with this KV pool.
      log::warn("request {} needs more KV than the pool holds; aborting it", waiting_.front()->id);
      finish(*waiting_.front(), FinishReason::kAbort);
      waiting_.pop_front();
    }
    publish();
    return false;
  }

  std::vector<SeqStep>& steps = steps_;
  std::vector<SampleResult>& out = out_;
  steps.assign(sched.size(), SeqStep{});
  // A request left waiting with a seat free and blocks for its first chunk joins the next step (its rows
  // differ from this one's): a step the runner started early would go unread, so it is not asked for.
  bool joins = !waiting_.empty() && int(running_.size()) < opt_.max_num_seqs;
  if (joins) {
    const Seq& w = *waiting_.front();
    const int chunk = std::min(int(w.tokens.size()) - w.num_computed, opt_.max_num_batched_tokens);
    joins = pool_.num_free() * block_size_ >= w.num_computed + chunk;  // (a prefix-cache hit needs fewer)
  }
  out.assign(sched.size(), SampleResult{});
  constrained_.clear();
  for (size_t i = 0; i < sched.size(); ++i) {
    auto [s, n] = sched[i];
    SeqStep& st = steps[i];
    st.seq_id = s->id;
    st.tokens = s->spec.empty() ? std::span<const int32_t>(s->tokens).subspan(size_t(s->num_computed), size_t(n))
                                : std::span<const int32_t>(s->spec);
    st.start_pos = s->num_computed;
    st.block_table = s->blocks;
    st.sliding_table = s->sw_blocks;
    st.sample = s->num_computed + n == int(s->tokens.size()) || !s->spec.empty();
    st.sampling = s->req.sampling;
    st.banned = s->generated < s->req.min_tokens ? std::span<const int32_t>(s->req.stop_token_ids) : std::span<const int32_t>{};
    st.logit_bias = s->req.logit_bias;
    if (st.sample && s->req.constraint) constrained_.push_back(i);
    if (s->req.sampling.penalized()) {
      st.history = s->tokens;
      st.prompt_len = int(s->tokens.size()) - s->generated;
    }
    st.rng_step = uint64_t(s->generated);
    // This step's token is not the last by length and no request joins: the runner may start the next step early.
    st.expect_next = st.sample && continues(*s) && !joins && s->spec.empty();
    if (!s->spec.empty()) {  // each draft checked against its row's argmax
      st.prompt_targets = std::span<const int32_t>(s->spec).subspan(1);
      st.prompt_top = 1;
    } else if (s->wants_prompt_lp()) {  // the rows of prompt positions whose log-probs are not known yet
      const int first = std::max(s->num_computed, int(s->prompt_lp.size()));
      const int end = std::min(s->num_computed + n, int(s->req.prompt.size()) - 1);
      if (end > first) {
        st.prompt_row0 = first - s->num_computed;
        st.prompt_targets = std::span<const int32_t>(s->tokens).subspan(size_t(first) + 1, size_t(end - first));
        st.prompt_top = s->req.prompt_logprobs;
      }
    }
    int prompt_left = int(s->req.prompt.size()) - s->num_computed;
    if (prompt_left > 0) prompt_tokens += uint64_t(std::min(prompt_left, n));
  }
  // Each mask is a walk of the vocabulary (0.1-0.5 ms): rows side by side on a pool, each its own constraint.
  auto mask = [this](int64_t a, int64_t b) {  // (one pointer captured: no allocation for the std::function)
    for (int64_t k = a; k < b; ++k) {
      const size_t i = constrained_[size_t(k)];
      steps_[i].allowed = sched_[i].first->req.constraint->allowed();
    }
  };
  if (constrained_.size() > 1) {
    if (!mask_pool_) mask_pool_ = std::make_unique<ThreadPool>(std::min(8, int(std::max(1u, std::thread::hardware_concurrency()))));
    mask_pool_->parallel_for(int64_t(constrained_.size()), mask);
  } else {
    mask(0, int64_t(constrained_.size()));
  }
  runner_.step(steps, out);

  uint64_t gen_tokens = 0, drafted = 0, accepted = 0;
  // Appends a sampled token to s and sends it; true when it ends the request.
  auto emit = [&](Seq* s, int32_t token, float logprob, const SampleResult* r) {
    TokenEvent ev;
    ev.token = token;
    ev.logprob = logprob;
    if (r) ev.top = r->top;
    ev.cached_tokens = std::max(s->cached_tokens, 0);
    if (s->wants_prompt_lp()) {
      ev.prompt_logprobs = std::move(s->prompt_lp);
      s->prompt_lp = {};
      s->prompt_lp_sent = true;
    }
    s->tokens.push_back(token);
    if (s->req.constraint) s->req.constraint->accept(token);
    ++s->generated;
    ++gen_tokens;
    bool is_stop = std::find(s->req.stop_token_ids.begin(), s->req.stop_token_ids.end(), token) != s->req.stop_token_ids.end();
    if (is_stop) {
      ev.stop_token = true;
      ev.finish = FinishReason::kStop;
    } else if (s->generated >= s->req.max_tokens || int(s->tokens.size()) >= max_model_len_) {
      ev.finish = FinishReason::kLength;
    }
    FinishReason f = ev.finish;
    s->ch->push_quiet(std::move(ev));
    if (f == FinishReason::kNone) return false;
    s->done = true;
    free_blocks(*s);
    std::lock_guard lk(mu_);
    --active_;
    return true;
  };
  for (size_t i = 0; i < sched.size(); ++i) {
    auto [s, n] = sched[i];
    SampleResult& r = out[i];
    if (!steps[i].prompt_targets.empty())
      MX_CHECK(r.prompt.size() == steps[i].prompt_targets.size(), "the runner returned {} prompt log-probs for {} rows",
               r.prompt.size(), steps[i].prompt_targets.size());
    if (!s->spec.empty()) {
      // Drafts up to the first the model disagrees with are its own greedy tokens; then the model's pick
      // there (or after the last draft, the step's sampled token). The KV past them is rewritten later.
      const int k = int(s->spec.size()) - 1;
      int m = 0;
      while (m < k && !r.prompt[size_t(m)].top.empty() && r.prompt[size_t(m)].top[0].first == s->spec[size_t(m) + 1]) ++m;
      s->num_computed += 1 + m;
      drafted += uint64_t(k);
      accepted += uint64_t(m);
      bool ended = false;
      for (int j = 0; j < m && !ended; ++j) ended = emit(s, s->spec[size_t(j) + 1], r.prompt[size_t(j)].logprob, nullptr);
      if (!ended) {
        cache_full_blocks(*s);  // (the accepted drafts are known tokens now)
        if (m < k) emit(s, r.prompt[size_t(m)].top[0].first, r.prompt[size_t(m)].top[0].second, nullptr);
        else emit(s, r.token, r.logprob, &r);
      }
      s->spec.clear();
      to_wake_.push_back(s->ch);
      continue;
    }
    s->num_computed += n;
    cache_full_blocks(*s);
    if (!steps[i].prompt_targets.empty())
      for (TokenLogprob& t : r.prompt) s->prompt_lp.push_back(std::move(t));
    if (!steps[i].sample) continue;
    emit(s, r.token, r.logprob, &r);
    to_wake_.push_back(s->ch);
  }
  waker_.post(to_wake_);
  std::erase_if(running_, [](auto& s) { return s->done; });
  const double busy = runner_.device_busy_seconds();
  {
    std::lock_guard lk(mu_);
    stats_.prompt_tokens += prompt_tokens;
    stats_.generation_tokens += gen_tokens;
    stats_.spec_draft_tokens += drafted;
    stats_.spec_accepted_tokens += accepted;
    ++stats_.steps;
    stats_.device_busy_seconds = busy;
    ready_ = true;
  }
  publish();
  return true;
}

void Engine::warmup() {
  // One single-token step on a scratch block, so /ready means "a forward step has completed"
  // before any client arrives (and first-request latency does not include lazy start-up work).
  try {
    const int need = kv_.sliding_window > 0 ? 2 : 1;
    MX_CHECK(pool_.num_free() >= need, "the KV cache has fewer than {} blocks", need);
    int32_t block = pool_.allocate(), sw_block = need == 2 ? pool_.allocate() : -1;
    int32_t token = 0;
    SeqStep s;
    s.seq_id = -1;
    s.tokens = {&token, 1};
    s.block_table = {&block, 1};
    if (sw_block >= 0) s.sliding_table = {&sw_block, 1};
    s.sample = true;
    s.sampling.temperature = 0.0f;
    SampleResult r;
    runner_.step({&s, 1}, {&r, 1});
    pool_.release(block);
    if (sw_block >= 0) pool_.release(sw_block);
  } catch (const std::exception& e) {
    log::error("engine warm-up step failed: {}", e.what());
    return;
  }
  std::lock_guard lk(mu_);
  ready_ = true;
}

void Engine::loop() {
  warmup();
  for (;;) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      // A failing step ends the requests in it, never the process.
      log::error("engine step failed: {}; aborting running requests", e.what());
      for (auto& s : running_) finish(*s, FinishReason::kAbort);
      running_.clear();
    }
    std::unique_lock lk(mu_);
    if (stop_) break;
    if (!worked) cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return stop_ || !inbox_.empty() || !aborts_.empty(); });
    if (stop_) break;
  }
  for (auto& s : running_) finish(*s, FinishReason::kAbort);
  for (auto& s : waiting_) finish(*s, FinishReason::kAbort);
  std::deque<std::unique_ptr<Seq>> left;
  {
    std::lock_guard lk(mu_);
    left.swap(inbox_);
  }
  for (auto& s : left) finish(*s, FinishReason::kAbort);
}

void Engine::start() {
  thread_ = std::thread([this] { loop(); });
}

void Engine::drain_and_stop(std::chrono::milliseconds timeout) {
  {
    std::lock_guard lk(mu_);
    draining_ = true;
  }
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    {
      std::lock_guard lk(mu_);
      if (active_ == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace mx::runtime
