// Tensor parallelism (--tensor-parallel-size, --nnodes, --node-rank, --master-addr, --master-port): the
// options as parsed once, their checks against a model, and which slice of each layer a rank holds.
// Attention splits by KV-head group (a rank keeps whole groups: its query heads read only its KV heads),
// the MoE by experts or by the intermediate dimension, lm_head by vocabulary. A split that does not divide
// evenly gives the first ranks one unit more (units: heads, experts, 64 intermediate columns, 8 rows).
#pragma once
#include <string>

#include "model/config.h"

namespace mx {

// How the experts are split: each rank holds E / size whole experts (expert parallel), or a slice of every
// expert's intermediate dimension (tensor parallel).
enum class MoeSplit { kExperts, kIntermediate };

struct TensorParallel {
  int size = 1;                          // ranks (GPUs) in all, over every node
  int nnodes = 1, node_rank = 0;         // hosts, and this one's index
  std::string master_addr = "127.0.0.1";  // node 0's address: the rendezvous that hands out NCCL's id
  int master_port = 29500;
  MoeSplit moe = MoeSplit::kIntermediate;  // --enable-expert-parallel: kExperts
  int ranks_per_node() const { return size / nnodes; }
  int first_rank() const { return node_rank * ranks_per_node(); }
};

// Fails with one line naming the flag: a size not in 1, 2, 4, 8; nodes that do not divide it; a node rank
// out of range; a port out of range; a model whose KV heads or experts do not divide by the size.
void check_tensor_parallel(const TensorParallel& tp, const ModelConfig& cfg);

// The intermediate split's unit (columns): whole MXFP4 blocks, and the prefill MoE's 64-value K step.
constexpr int kInterUnit = 64;

// [begin, begin + count) of `units` split over `parts`, for part `i`: the first units % parts parts get
// one more.
struct Range {
  int begin = 0, count = 0;
};
Range split_range(int units, int parts, int i);

// What rank `rank` of `size` holds. Ranges are in model units (heads, experts, intermediate columns,
// vocabulary rows).
struct ShardDims {
  Range q_heads, kv_heads, experts, inter, vocab;
};
ShardDims shard_dims(const ModelConfig& cfg, int rank, int size, MoeSplit moe);

}  // namespace mx
