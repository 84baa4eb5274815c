#include "runtime/speculative_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"

namespace mx::runtime {

void parse_speculative_config(std::string_view json, EngineOptions& opt) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    fail("--speculative-config: not JSON: {}", e.what());
  }
  if (!j.is_object()) fail("--speculative-config: a JSON object is expected");
  auto integer = [&](const char* key, int lo, int hi, int dflt) {
    if (!j.contains(key)) return dflt;
    const auto& v = j[key];
    if (!v.is_number_integer() || v.get<long long>() < lo || v.get<long long>() > hi)
      fail("--speculative-config: {} must be an integer in [{}, {}]", key, lo, hi);
    return v.get<int>();
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "method" && k != "num_speculative_tokens" && k != "prompt_lookup_max" && k != "prompt_lookup_min" &&
        k != "disable_by_batch_size")
      fail("--speculative-config: unknown key {} (method, num_speculative_tokens, prompt_lookup_max, "
                              "prompt_lookup_min, disable_by_batch_size)", k);
  }
  if (!j.contains("method") || !j["method"].is_string()) fail("--speculative-config: method is required (\"ngram\")");
  const std::string method = j["method"].get<std::string>();
  if (method != "ngram")
    fail("--speculative-config: method {} is not offered (n-gram speculation only: \"ngram\"; no draft "
                            "model or EAGLE heads)", method);
  if (!j.contains("num_speculative_tokens")) fail("--speculative-config: num_speculative_tokens is required");
  opt.spec_tokens = integer("num_speculative_tokens", 1, 16, 0);
  opt.spec_ngram_max = integer("prompt_lookup_max", 1, 16, 4);
  opt.spec_ngram_min = integer("prompt_lookup_min", 1, opt.spec_ngram_max, std::min(2, opt.spec_ngram_max));
  opt.spec_max_running = integer("disable_by_batch_size", 1, 1 << 16, 8);
}

}  // namespace mx::runtime
