// The engine loop: request state, a token-budget scheduler over a paged KV cache and the thread
// that drives ModelRunner::step. HTTP threads submit requests through a thread-safe queue and
// read tokens from a per-request channel.
//
// Scheduling (vLLM-style, no separate prefill/decode phases): each sequence has `tokens` (prompt +
// generated) and `num_computed`; every step gives each running sequence min(missing, budget)
// tokens, decodes (1 missing token) first, then chunks of prefill for partial/waiting requests,
// within max_num_batched_tokens. When KV blocks run out, the most recently admitted sequence is
// preempted by recompute: its blocks are freed and it goes back to the front of the waiting
// queue with its generated tokens kept as known tokens.
//
// Prefix caching (EngineOptions::enable_prefix_caching, see block_pool.h): every full block a
// sequence has computed is registered in the pool's cache; on admission a sequence takes
// references on the longest cached chain of its known tokens (never all of them: the last one is
// always computed so there are logits to sample from) and starts computing after it. Blocks of
// finished, aborted or preempted sequences stay cached until the pool needs them.
//
// Sliding-window layers (KvCacheShape::sliding_window > 0) have block tables of their own, from the
// same pool: a sequence holds their blocks only from the window of its next computed position on
// (window + chunk positions instead of all of them) and gives older ones back each step. Reuse is
// still exact: a block's KV is a pure function of the tokens at positions [0, end of block), so the
// sliding layers' blocks are registered in the cache beside the full layers' ones (under their own
// key, with the full-layer block before them as parent), and a cached prefix is taken only as far
// as the sliding blocks of its last window are still cached.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "model/model_runner.h"
#include "runtime/block_pool.h"

namespace mx::runtime {

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason r);

struct TokenEvent {
  int32_t token = -1;          // -1 for a pure finish event
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
  FinishReason finish = FinishReason::kNone;
  bool stop_token = false;     // `token` is the stop token that ended the request
  int cached_tokens = 0;       // prompt tokens served from the prefix cache at admission
  // With the first token of a request that asked for them (GenRequest::prompt_logprobs): prompt tokens
  // 1.. each under the prompt before it (token 0 has none).
  std::vector<TokenLogprob> prompt_logprobs;
};

// Per-request delivery queue (engine thread -> HTTP thread).
class Channel {
 public:
  void push(TokenEvent ev);
  // push without waking the reader: the engine wakes a step's readers through a Waker.
  void push_quiet(TokenEvent ev);
  void wake();
  // Waits up to `timeout` for events; returns all pending ones (empty on timeout).
  std::vector<TokenEvent> pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> q_;
};

// Wakes the readers of a step's channels on its own thread, while the next step runs: a futex wake a
// reader costs the engine thread ~3 us, ~1.5 ms a step at 512 streams (docs/perf.md, session 29).
class Waker {
 public:
  Waker();
  ~Waker();  // wakes what is pending, then joins
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  // Takes the channels (`chs` is left empty, its capacity reused).
  void post(std::vector<std::shared_ptr<Channel>>& chs);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Channel>> pending_, work_;
  bool stop_ = false;
  std::thread thread_;
};

// What a request's next token may be (structured output), asked before each of its sampled tokens and
// told each one generated; one object a sequence, called by one thread at a time (the engine's, or its
// mask pool's within a step).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Bits over the vocabulary (SeqStep::allowed), valid until the next call; empty = any.
  virtual std::span<const uint64_t> allowed() = 0;
  virtual void accept(int32_t token) = 0;
};

struct GenRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  int min_tokens = 0;                    // the stop tokens cannot be sampled before this many tokens
  std::vector<int32_t> stop_token_ids;   // generation ends with finish "stop" on any of these
  std::vector<LogitBias> logit_bias;     // added to the logits before sampling, one entry an id
  std::shared_ptr<TokenConstraint> constraint;  // null = unconstrained
  // The prompt's own log-probs (completions' echo with logprobs, vLLM's prompt_logprobs): -1 off, else
  // the alternatives each prompt token reports (0..kMaxPromptTop). Such a prompt is computed, not taken
  // from the prefix cache, up to its last token.
  int prompt_logprobs = -1;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct EngineOptions {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_waiting = 256;        // bounded queue beyond the free seats: submit() fails past it (server: 429)
  // Prompt tokens a step may take while it also decodes (0 = the whole budget): running streams keep a
  // short step, and so a steady TPOT, while a wave of new prompts is prefilled; a step with no decodes
  // takes the whole max_num_batched_tokens.
  int max_prefill_tokens_with_decodes = 2048;
  int max_model_len = 0;        // 0 = the model's max_position_embeddings
  bool enable_prefix_caching = true;
  BlockHashFn block_hash = nullptr;  // nullptr = default_block_hash; tests force collisions
  // N-gram speculation (ngram_proposer.h): a greedy decoding row with no logit adjustments, log-probs or
  // constraint adds up to spec_tokens drafts, which the step checks as prompt log-prob rows (the argmax of
  // each row); the row keeps the drafts that match and the model's own next token. 0 = off. Only while at
  // most spec_max_running sequences run: on a full GPU the drafts' rows cost more than they save.
  int spec_tokens = 0;
  int spec_ngram_min = 2, spec_ngram_max = 4;
  int spec_max_running = 8;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  double kv_usage = 0.0;       // fraction of blocks in use
  int64_t kv_capacity_tokens = 0;  // blocks x block size of the pool (full and sliding pages alike)
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t steps = 0;
  double device_busy_seconds = 0;     // the runner's (ModelRunner::device_busy_seconds)
  uint64_t prefix_cache_queries = 0;  // prompt tokens looked up at first admission
  uint64_t prefix_cache_hits = 0;     // of which served from the cache
  int cached_blocks = 0;              // blocks currently registered in the prefix cache
  uint64_t spec_draft_tokens = 0;     // drafts checked (EngineOptions::spec_tokens)
  uint64_t spec_accepted_tokens = 0;  // of which the model agreed with
};

class Engine {
 public:
  Engine(ModelRunner& runner, const EngineOptions& opt);
  ~Engine();

  // Thread-safe. Returns nullopt when the waiting queue is full or the engine is draining.
  std::optional<int64_t> submit(GenRequest req, std::shared_ptr<Channel> ch);
  void abort(int64_t id);  // thread-safe; the KV blocks are freed by the next step

  void start();            // runs the loop on its own thread
  // Stops admitting, waits up to `timeout` for running/waiting requests, aborts the rest, joins.
  void drain_and_stop(std::chrono::milliseconds timeout);
  bool draining() const;
  bool ready() const;      // a forward step has completed
  EngineStats stats() const;
  int max_model_len() const { return max_model_len_; }

  // One scheduling + forward step (the loop calls it; tests call it directly without start()).
  // Returns false when there was nothing to do.
  bool step();

 private:
  struct Seq;
  void take_inbox();
  void finish(Seq& s, FinishReason r);
  void free_blocks(Seq& s);
  void preempt(Seq& s);
  bool ensure_blocks(Seq& s, int num_tokens);
  // Its token this step is not the last by length (max_tokens, max_model_len): another step follows.
  bool continues(const Seq& s) const;
  // Fills s.spec with the last token and its drafts when the row may speculate this step; returns the drafts.
  int propose(Seq& s, int budget);
  int reuse_cached_prefix(Seq& s);
  void cache_full_blocks(Seq& s);
  void loop();

  void warmup();
  ModelRunner& runner_;
  EngineOptions opt_;
  KvCacheShape kv_;
  int block_size_;
  int max_model_len_;
  BlockPool pool_;

  mutable std::mutex mu_;             // guards inbox_, aborts_, stats_, flags
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> inbox_;
  std::vector<int64_t> aborts_;
  int64_t next_id_ = 1;
  int active_ = 0;                    // submitted and not yet finished (for drain)
  bool draining_ = false, stop_ = false, ready_ = false;
  EngineStats stats_;

  // Engine-thread state.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  // A step's schedule and runner I/O, kept so a warm step allocates no vectors.
  std::vector<std::pair<Seq*, int>> sched_;
  std::vector<SeqStep> steps_;
  std::vector<SampleResult> out_;
  std::vector<std::shared_ptr<Channel>> to_wake_;  // the step's channels with new events
  std::vector<size_t> constrained_;                // the step's rows with a constraint
  std::unique_ptr<ThreadPool> mask_pool_;          // their masks, made side by side (started at the first)
  Waker waker_;
  std::thread thread_;
};

}  // namespace mx::runtime
