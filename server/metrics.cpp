#include "server/metrics.h"

#include <fmt/format.h>

namespace mx::server {

void Histogram::observe(double v) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (v <= kBounds[i]) ++counts_[i];
  ++n_;
  sum_ += v;
}

std::string Histogram::text(const std::string& name, const std::string& labels) const {
  std::string out = fmt::format("# TYPE {} histogram\n", name);
  for (size_t i = 0; i < kBounds.size(); ++i)
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, kBounds[i], counts_[i]);
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, n_, name, labels, sum_,
                     name, labels, n_);
  return out;
}

void Metrics::ttft(double s) { std::lock_guard lk(mu_); ttft_.observe(s); }
void Metrics::itl(double s) { std::lock_guard lk(mu_); itl_.observe(s); }
void Metrics::e2e(double s) { std::lock_guard lk(mu_); e2e_.observe(s); }

std::string Metrics::text(const std::string& model, const runtime::EngineStats& st) const {
  std::string l = fmt::format("model_name=\"{}\"", model);
  std::string out;
  auto gauge = [&](const char* n, double v) { out += fmt::format("# TYPE {} gauge\n{}{{{}}} {}\n", n, n, l, v); };
  auto counter = [&](const char* n, uint64_t v) { out += fmt::format("# TYPE {} counter\n{}{{{}}} {}\n", n, n, l, v); };
  gauge("vllm:num_requests_running", st.running);
  gauge("vllm:num_requests_waiting", st.waiting);
  gauge("vllm:kv_cache_usage_perc", st.kv_usage);
  gauge("mxserve:kv_cache_capacity_tokens", double(st.kv_capacity_tokens));
  counter("vllm:num_preemptions_total", st.preemptions);
  counter("vllm:prompt_tokens_total", st.prompt_tokens);
  counter("vllm:generation_tokens_total", st.generation_tokens);
  counter("vllm:prefix_cache_queries_total", st.prefix_cache_queries);
  counter("vllm:prefix_cache_hits_total", st.prefix_cache_hits);
  counter("mxserve:engine_steps_total", st.steps);
  counter("vllm:spec_decode_num_draft_tokens_total", st.spec_draft_tokens);  // --speculative-config
  counter("vllm:spec_decode_num_accepted_tokens_total", st.spec_accepted_tokens);
  // The GPU's time in steps (CUDA engine; 0 on the CPU): its rate against wall time is the share of the
  // time the GPU works, the rest being the host's turns between steps.
  out += fmt::format("# TYPE mxserve:device_busy_seconds_total counter\nmxserve:device_busy_seconds_total{{{}}} {:.6f}\n", l,
                     st.device_busy_seconds);
  std::lock_guard lk(mu_);
  out += ttft_.text("vllm:time_to_first_token_seconds", l);
  out += itl_.text("vllm:inter_token_latency_seconds", l);
  out += e2e_.text("vllm:e2e_request_latency_seconds", l);
  return out;
}

}  // namespace mx::server
