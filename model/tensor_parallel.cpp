#include "model/tensor_parallel.h"

#include "core/error.h"

namespace mx {

void check_tensor_parallel(const TensorParallel& tp, const ModelConfig& cfg) {
  if (tp.size != 1 && tp.size != 2 && tp.size != 4 && tp.size != 8)
    fail("--tensor-parallel-size {}: expected 1, 2, 4 or 8", tp.size);
  if (tp.nnodes < 1 || tp.size % tp.nnodes)
    fail("--nnodes {}: must be at least 1 and divide --tensor-parallel-size {}", tp.nnodes, tp.size);
  if (tp.node_rank < 0 || tp.node_rank >= tp.nnodes)
    fail("--node-rank {}: expected 0 .. {} (--nnodes {})", tp.node_rank, tp.nnodes - 1, tp.nnodes);
  if (tp.master_port < 1 || tp.master_port > 65535) fail("--master-port {}: expected 1 .. 65535", tp.master_port);
  if (tp.master_addr.empty()) fail("--master-addr: empty");
  if (cfg.num_kv_heads % tp.size)
    fail("--tensor-parallel-size {}: the model's {} KV heads do not split evenly (attention splits by KV head)",
         tp.size, cfg.num_kv_heads);
  if (cfg.num_experts % tp.size)
    fail("--tensor-parallel-size {}: the model's {} experts do not split evenly", tp.size, cfg.num_experts);
  if (cfg.intermediate_size % kInterUnit || cfg.intermediate_size / kInterUnit < tp.size)
    fail("--tensor-parallel-size {}: the intermediate size {} does not split into {} slices of whole {}-column units",
         tp.size, cfg.intermediate_size, tp.size, kInterUnit);
  if (cfg.vocab_size % (8 * tp.size))
    fail("--tensor-parallel-size {}: the vocabulary ({}) does not split into {} equal slices of whole 8-row units "
         "(lm_head splits by vocabulary)", tp.size, cfg.vocab_size, tp.size);
}

Range split_range(int units, int parts, int i) {
  const int base = units / parts, extra = units % parts;
  return Range{i * base + (i < extra ? i : extra), base + (i < extra ? 1 : 0)};
}

namespace {
// A range of `units` of `unit` model columns, in columns.
Range scaled(Range r, int unit) { return Range{r.begin * unit, r.count * unit}; }
}  // namespace

ShardDims shard_dims(const ModelConfig& cfg, int rank, int size, MoeSplit moe) {
  ShardDims d;
  const int group = cfg.num_heads / cfg.num_kv_heads;
  d.kv_heads = split_range(cfg.num_kv_heads, size, rank);
  d.q_heads = scaled(d.kv_heads, group);
  if (moe == MoeSplit::kExperts) {
    d.experts = split_range(cfg.num_experts, size, rank);
    d.inter = Range{0, cfg.intermediate_size};
  } else {
    d.experts = Range{0, cfg.num_experts};
    // Units of 64 columns: whole MXFP4 blocks of FC2's K, and the prefill MoE's K step.
    d.inter = scaled(split_range(cfg.intermediate_size / kInterUnit, size, rank), kInterUnit);
  }
  d.vocab = scaled(split_range(cfg.vocab_size / 8, size, rank), 8);  // GEMM widths stay multiples of 8
  if (rank == size - 1) d.vocab.count = cfg.vocab_size - d.vocab.begin;  // a vocabulary not a multiple of 8
  return d;
}

}  // namespace mx
