// The one-token decode step as one persistent, warp-specialized kernel (sm_90+): the batch-1 path.
//
// Every SM runs one CTA. Its producer warp streams the weights of the SM's share of every op of every
// layer, in order, into a ring of shared-memory slots with the bulk copy engine; it runs ahead of the
// math across op and layer boundaries and stops only where the addresses depend on the step (the
// layer's routing, before the expert weights) or the ring is full. The consumer warps compute each
// slot as it lands. So HBM keeps streaming while the math waits on the ops before it (the attention,
// the router, the norms), which is where the six launches per layer lose half their time.
//
// A slot holds whole weight rows with all of K: one or two rows (bf16: o-proj; qkv, router) or eight
// rows (MXFP4 experts); each consumer warp owns two slots, computing one while the other loads. With one token, seven of the mma's eight B columns are free, so K is split into
// parts over the A fragment rows and each part is matched with the B column of the same part
// (fragment row = (row, part), column = part): a warp finishes its rows alone, with no cross-warp or
// cross-CTA reduction, and the slot is one contiguous copy per row range.
//
// Op order per layer and the waits between them (release / acquire counters in global memory):
//   qkv (norm of the residual; rows d and d + D/2 of a head per slot, so RoPE meets in one lane)
//   attention (decode_step's body, on four consumer warps; waits for its KV head's qkv rows)
//   o-proj (waits for the attention; accumulates into the residual)
//   router + FC1 (wait for the o-proj; the producer waits for the router, then routes the token)
//   FC2 (waits for FC1 of its experts)
//   and the next layer's qkv waits for FC2.
#pragma once
#include <cstddef>
#include <string>

#include "kernels/decode/decode_step.h"

namespace mx::cuda {

// Whether this GPU and model shape can run the kernel (sm_90+, the widths it instantiates); *why says
// what is missing. M is checked at launch (one token only).
bool decode_stream_supported(const DecodeStepParams& shape, std::string* why = nullptr);

// Diagnostics (DecodeStepParams::trace, bench --step-trace): per layer and SM, kStreamTraceWords
// globaltimer stamps (kStreamTrace* below); the buffer holds decode_stream_trace_words(layers, sms).
constexpr int kStreamTraceWords = 10;
enum StreamTraceStamp {
  kStreamQkvReady,    // consumers: the layer's qkv input staged
  kStreamOprojReady,  // attention done everywhere, its output staged
  kStreamMlpReady,    // o-proj done everywhere, the MLP input staged
  kStreamRouted,      // producer: routing known (FC1 copies may start)
  kStreamFc2Ready,    // FC1 of this SM's FC2 experts done, their inputs staged
  kStreamLayerDone,   // consumers: this SM's FC2 units done
  kStreamAttnStart,   // this SM's attention items: started (after its qkv units), and done
  kStreamAttnDone,
  kStreamAttnWaited,  // its last item's wait for the qkv rows satisfied
};
// Then, for layer kStreamTraceLayer (or the last), per SM and unit (up to kStreamTraceUnits in the
// CTA's order): when the producer took the slot, when the consumer found it full, when the consumer
// was done, and kind | warp << 8 (kind: 0 qkv, 1 o-proj, 2 router, 3 FC1, 4 FC2).
constexpr int kStreamTraceLayer = 6, kStreamTraceUnits = 128;
size_t decode_stream_trace_words(int num_layers, int sms);

// Zeroes the counters and launches the step (one cooperative grid of one CTA per SM). p.M must be 1.
void decode_stream(const DecodeStepParams& p, cudaStream_t s);

}  // namespace mx::cuda
