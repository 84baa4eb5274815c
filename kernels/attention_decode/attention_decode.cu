// The decode attention as its own grid, (KV head, token, split); the body is attention_decode_body.cuh.
#include "kernels/attention_decode/attention_decode.h"

#include <string>

#include "kernels/attention_decode/attention_decode_body.cuh"
#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {
namespace {

// Grid (KV head x head group, token, split).
template <int D, int GH, bool kFp8>
__global__ void __launch_bounds__(128) attn_decode_k(AttnDecodeParams p) {
  constexpr int HG = body::kAttnG / GH;
  trace_begin(p.trace);
  body::attn_decode<D, GH, kFp8>(p, blockIdx.x / HG, blockIdx.x % HG, blockIdx.y, blockIdx.z,
                                 TracedPdlWait{p.trace.buf});
  trace_end(p.trace, 1);
}

template <int D, bool kFp8>
void launch(const AttnDecodeParams& p, cudaStream_t s) {
  const int GH = p.heads_per_cta;
  const dim3 grid(p.Hkv * (kAttnDecodeGroup / GH), p.M, kAttnDecodeSplits);
  if (GH == 1) launch_pdl(attn_decode_k<D, 1, kFp8>, grid, dim3(128), 0, s, p);
  else if (GH == 2) launch_pdl(attn_decode_k<D, 2, kFp8>, grid, dim3(128), 0, s, p);
  else if (GH == 4) launch_pdl(attn_decode_k<D, 4, kFp8>, grid, dim3(128), 0, s, p);
  else if (GH == 8) launch_pdl(attn_decode_k<D, 8, kFp8>, grid, dim3(128), 0, s, p);
  else throw_error("attention_decode: heads_per_cta must be 1, 2, 4 or 8, got " + std::to_string(GH));
}

template <int D>
void launch(const AttnDecodeParams& p, cudaStream_t s) {
  if (p.kv.fp8()) launch<D, true>(p, s);
  else launch<D, false>(p, s);
}

}  // namespace

void attention_decode(const AttnDecodeParams& p, cudaStream_t s) {
  require_kv(p.kv, "attention_decode");
  if (p.Hq != kAttnDecodeGroup * p.Hkv) throw_error("attention_decode: needs 8 query heads per KV head");
  if (p.D == 64) launch<64>(p, s);
  else if (p.D == 16) launch<16>(p, s);
  else throw_error("attention_decode: head_dim " + std::to_string(p.D) + " is not instantiated (16, 64)");
}

}  // namespace mx::cuda
