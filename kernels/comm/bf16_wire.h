// The large sums' wire format (TpComm): fp32 rows rounded to bf16 (to nearest even) before NCCL sums
// them, and widened back after, so a sum moves half the bytes. Two ranks' bf16 sum rounds once more; the
// rows are bf16 in the checkpoint's own arithmetic (transformers keeps the residual in bf16).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mx::cuda {

// out[i] = bf16(in[i]); with zero_in, in[i] = 0 after (a rank's partial rows, zero for the next layer's).
void launch_pack_bf16(float* in, uint16_t* out, size_t n, bool zero_in, cudaStream_t s);
// out[i] = float(in[i]).
void launch_unpack_bf16(const uint16_t* in, float* out, size_t n, cudaStream_t s);

}  // namespace mx::cuda
