// One tensor-parallel rank's weights (model/tensor_parallel.h), cut out of the checkpoint's tensors into
// host buffers in the layout the whole model uses, so that a runner loads a shard as it loads the model:
//   q, k, v, their biases and the sinks: the rank's heads (rows); o-proj: the same heads' columns;
//   experts: the rank's experts (kExperts) or every expert's slice of the intermediate dimension (gate /
//   up rows, the down-projection's columns in whole MXFP4 blocks); lm_head: the rank's vocabulary rows;
//   norms, embedding and router: whole.
// The shards' partial o-proj and expert outputs sum to the model's: their biases are on rank 0 only
// (zeros elsewhere), except the experts' own biases under kExperts.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace mx {

struct ShardWeights {
  ModelConfig cfg;       // the shard's sizes: heads, experts or intermediate size, vocabulary
  ModelWeights weights;  // into `storage`, or into the model's tensors where the shard holds all of one
  std::vector<std::vector<uint8_t>> storage;
};

ShardWeights shard_weights(const ModelWeights& w, const ModelConfig& cfg, const ShardDims& d, MoeSplit moe,
                           bool bias_owner);

}  // namespace mx
