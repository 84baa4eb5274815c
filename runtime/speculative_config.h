// `--speculative-config` (vLLM's JSON): {"method": "ngram", "num_speculative_tokens": K,
// "prompt_lookup_max": N, "prompt_lookup_min": M, "disable_by_batch_size": B} into EngineOptions' spec_*
// fields. Throws mx::Error naming the key on anything else.
#pragma once
#include <string_view>

#include "runtime/engine.h"

namespace mx::runtime {

void parse_speculative_config(std::string_view json, EngineOptions& opt);

}  // namespace mx::runtime
