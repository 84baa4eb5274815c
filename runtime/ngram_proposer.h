// N-gram speculation (vLLM's "ngram" method, prompt lookup): the draft tokens for a sequence are those that
// followed the latest earlier occurrence of its last n tokens, n tried from max_n down to min_n. The engine
// has the model check them all in one step (engine.h, EngineOptions::spec_tokens).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace mx::runtime {

// How far back a match is looked for: bounds the host's work a sequence and step (~4 comparisons a token).
constexpr int kNgramLookback = 4096;

// Appends to `out` up to k tokens that followed the latest earlier occurrence (within kNgramLookback tokens)
// of the last n tokens of `tokens`, for the largest n in [min_n, max_n] that occurs; appends nothing when
// none does. Returns how many it appended.
int propose_ngram(std::span<const int32_t> tokens, int k, int min_n, int max_n, std::vector<int32_t>& out);

}  // namespace mx::runtime
