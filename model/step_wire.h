// A step (the SeqSteps a runner is asked to compute) as bytes, for tensor parallelism across hosts:
// node 0 sends each step to the other nodes (core/rendezvous.h's NodeLink), whose ranks run it too.
// Both ends are the same build on the same architecture: plain native-endian fields behind a magic word.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/model_runner.h"

namespace mx {

// Appends the step and the number of results asked for to `out` (cleared first).
void encode_step(std::span<const SeqStep> seqs, size_t num_results, std::string& out);

// A decoded step: seqs' spans point into `ints`. Reused from step to step (no allocation once grown).
struct WireStep {
  std::vector<SeqStep> seqs;
  std::vector<int32_t> ints;
  std::vector<LogitBias> biases;
  std::vector<uint64_t> allowed;
  size_t num_results = 0;
};
// Fails with one line on bytes that are not an encoded step.
void decode_step(const std::string& in, WireStep& out);

}  // namespace mx
