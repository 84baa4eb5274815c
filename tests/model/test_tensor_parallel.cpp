// Tensor-parallel options and shard slices (model/tensor_parallel.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/tensor_parallel.h"

namespace {
using namespace mx;

std::string error_of(const TensorParallel& tp, const ModelConfig& cfg) {
  try {
    check_tensor_parallel(tp, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallel, ChecksNameTheFlag) {
  const ModelConfig c = preset_config("120b");
  EXPECT_EQ(error_of(TensorParallel{}, c), "");
  EXPECT_EQ(error_of(TensorParallel{.size = 8}, c), "");
  EXPECT_EQ(error_of(TensorParallel{.size = 4, .nnodes = 2, .node_rank = 1}, c), "");
  EXPECT_NE(error_of(TensorParallel{.size = 3}, c).find("--tensor-parallel-size 3"), std::string::npos);
  EXPECT_NE(error_of(TensorParallel{.size = 2, .nnodes = 4}, c).find("--nnodes 4"), std::string::npos);
  EXPECT_NE(error_of(TensorParallel{.size = 2, .nnodes = 2, .node_rank = 2}, c).find("--node-rank 2"),
            std::string::npos);
  EXPECT_NE(error_of(TensorParallel{.size = 2, .master_port = 70000}, c).find("--master-port"), std::string::npos);
  ModelConfig odd = c;
  odd.num_kv_heads = 6;
  odd.num_heads = 48;
  EXPECT_NE(error_of(TensorParallel{.size = 4}, odd).find("6 KV heads"), std::string::npos);
  ModelConfig vocab = c;
  vocab.vocab_size += 8;  // slices of 8 rows, but not equal ones over 2 ranks
  EXPECT_NE(error_of(TensorParallel{.size = 2}, vocab).find("vocabulary"), std::string::npos);
  for (const char* p : {"120b", "20b"}) {
    const std::string e = error_of(TensorParallel{.size = 8}, preset_config(p));
    EXPECT_EQ(e, "") << p;
  }
  EXPECT_EQ(error_of(TensorParallel{.size = 2}, preset_config("mini")), "");  // the GPU tests' model
}

TEST(TensorParallel, RangesCoverEveryUnitOnce) {
  for (int units : {1, 7, 8, 90, 25136})
    for (int parts : {1, 2, 4, 8}) {
      int next = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = split_range(units, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.count, units / parts);
        EXPECT_LE(r.count, units / parts + 1);
        next += r.count;
      }
      EXPECT_EQ(next, units);
    }
}

TEST(TensorParallel, ShardsTileTheModel) {
  for (const char* p : {"120b", "20b"})
    for (int size : {1, 2, 4, 8})
      for (MoeSplit moe : {MoeSplit::kExperts, MoeSplit::kIntermediate}) {
        const ModelConfig c = preset_config(p);
        int q = 0, kv = 0, e = 0, i = 0, v = 0;
        for (int r = 0; r < size; ++r) {
          const ShardDims d = shard_dims(c, r, size, moe);
          EXPECT_EQ(d.q_heads.begin, q);
          EXPECT_EQ(d.kv_heads.begin, kv);
          EXPECT_EQ(d.q_heads.count, d.kv_heads.count * c.num_heads / c.num_kv_heads);  // whole groups
          EXPECT_EQ(d.vocab.begin, v);
          EXPECT_EQ(d.inter.count % kInterUnit, 0) << p << " size " << size;  // whole MXFP4 blocks, MoE K steps
          EXPECT_EQ(d.vocab.count, c.vocab_size / size);  // equal slices: the logits are all-gathered
          q += d.q_heads.count;
          kv += d.kv_heads.count;
          v += d.vocab.count;
          if (moe == MoeSplit::kExperts) {
            EXPECT_EQ(d.experts.begin, e);
            EXPECT_EQ(d.inter.count, c.intermediate_size);
            e += d.experts.count;
          } else {
            EXPECT_EQ(d.inter.begin, i);
            EXPECT_EQ(d.experts.count, c.num_experts);
            i += d.inter.count;
          }
        }
        EXPECT_EQ(q, c.num_heads);
        EXPECT_EQ(kv, c.num_kv_heads);
        EXPECT_EQ(v, c.vocab_size);
        EXPECT_EQ(moe == MoeSplit::kExperts ? e : i, moe == MoeSplit::kExperts ? c.num_experts : c.intermediate_size);
      }
}

}  // namespace
