// The decode attention as its own grid, (KV head, token, split); the body is attention_decode_body.cuh.
#include "kernels/attention_decode/attention_decode.h"

#include <string>

#include "kernels/attention_decode/attention_decode_body.cuh"
#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {
namespace {

template <int D>
__global__ void __launch_bounds__(128) attn_decode_k(AttnDecodeParams p) {
  trace_begin(p.trace);
  body::attn_decode<D>(p, blockIdx.x, blockIdx.y, blockIdx.z, TracedPdlWait{p.trace.buf});
  trace_end(p.trace, 1);
}

}  // namespace

void attention_decode(const AttnDecodeParams& p, cudaStream_t s) {
  if (p.Hq != kAttnDecodeGroup * p.Hkv) throw_error("attention_decode: needs 8 query heads per KV head");
  const dim3 grid(p.Hkv, p.M, kAttnDecodeSplits);
  if (p.D == 64) launch_pdl(attn_decode_k<64>, grid, dim3(128), 0, s, p);
  else if (p.D == 16) launch_pdl(attn_decode_k<16>, grid, dim3(128), 0, s, p);
  else throw_error("attention_decode: head_dim " + std::to_string(p.D) + " is not instantiated (16, 64)");
}

}  // namespace mx::cuda
