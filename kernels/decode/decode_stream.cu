// The one-token stream kernel (see decode_stream.h): a producer warp fills a ring of shared-memory
// slots with per-lane cp.async, consumer warps compute the slots' weight rows.
#include "kernels/decode/decode_stream.h"

#include <algorithm>
#include <string>

#include "kernels/attention_decode/attention_decode_body.cuh"
#include "kernels/common/bulk_ring.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/moe_body.cuh"

namespace mx::cuda {
namespace {
using namespace mma;
using namespace ring;

// Eight consumer warps with two slots each, so a warp computes one slot while its next one loads, and
// the producer (the last warp). Nine warps leave 168 registers per thread (a warp count over twelve
// would cap them at 128 and spill the attention item); sixteen 12 KB slots fill shared memory.
constexpr int kCw = 8, kCt = kCw * 32, kThreads = kCt + 32;
constexpr int kSlots = 2 * kCw;  // a compile-time count: slot and round of unit k are a mask and a shift
constexpr int kBarConsumers = 1, kBarAttn = 2;  // named barriers (0 is __syncthreads)
constexpr int kXGroupBytes = kGroupStride * 2;  // a staged MXFP4-order activation group (32 values, padded)
static_assert(body::kAttnWarps <= kCw, "the attention item runs on the first consumer warps");

// Counter words of one layer (the decode step's stride of 64 words).
constexpr int kLayerWords = 64, kCQkv = 0 /* + KV head */, kCAttn = 16, kCOproj = 17, kCRouter = 18, kCFc2 = 19,
              kCFc1 = 20 /* + expert slot */, kCResid = 24;

// Byte offsets in dynamic shared memory (computed by the launcher): the staged activations in
// natural bf16 order at 0 and in MXFP4 order at `perm`; the two FC2 inputs at `act` (over the first
// two, which no unit reads once FC1 is done); then the slots.
struct Geom {
  uint32_t perm, act, act_bytes, ring, slot_bytes;
};

struct Route {
  int e[kTopK];
  float w[kTopK];
};

__shared__ unsigned long long g_full[kSlots], g_empty[kSlots];
__shared__ float g_red[kCw];
__shared__ Route g_route[2];  // by layer parity: the producer routes layer l + 1 while consumers finish l
__shared__ float2 g_rope[32];  // (cos, sin) x concentration of the step's position, per rotary dim (D/2 <= 32)
extern __shared__ __align__(128) uint8_t g_dyn[];

struct Shape {
  int H, I, E, Hq, Hkv, D, Kq;
  __device__ explicit Shape(const DecodeStepParams& p)
      : H(p.H), I(p.I), E(p.E), Hq(p.Hq), Hkv(p.Hkv), D(p.D), Kq(p.Hq * p.D) {}
  // Units per op: qkv rows (d, d + D/2) of a head, in KV-head groups (8 q heads, k, v); o-proj rows
  // (one per slot: two of K = 4096 would not fit); router row pairs; FC1 / FC2 chunks of eight rows
  // per expert slot.
  __device__ int qkv_per_kv() const { return (body::kAttnG + 2) * (D / 2); }
  __device__ int qkv() const { return Hkv * qkv_per_kv(); }
  __device__ int oproj() const { return H; }
  __device__ int router() const { return E / 2; }
  __device__ int fc1_per() const { return I / 4; }
  __device__ int fc2_per() const { return H / 8; }
};

// The SM's contiguous share of an op's units.
struct Range {
  int lo, hi;
};
__device__ __forceinline__ Range share(int units, int sm, int nsm) {
  return {int(int64_t(units) * sm / nsm), int(int64_t(units) * (sm + 1) / nsm)};
}

// Unit trace (decode_stream.h): word `what` of unit `ku` (its index in the traced layer) of this SM.
__device__ __forceinline__ void unit_stamp(const DecodeStepParams& p, int l, int ku, int what, uint64_t v) {
  if (!p.trace || l != min(kStreamTraceLayer, p.num_layers - 1) || ku < 0 || ku >= kStreamTraceUnits) return;
  p.trace[size_t(p.num_layers) * gridDim.x * kStreamTraceWords + (size_t(blockIdx.x) * kStreamTraceUnits + ku) * 4 +
          what] = v;
}
__device__ __forceinline__ void stamp(const DecodeStepParams& p, int l, int what) {
  if (p.trace && threadIdx.x == 0)
    p.trace[(size_t(l) * gridDim.x + blockIdx.x) * kStreamTraceWords + what] = global_ns();
}

// Unit k of the CTA's sequence sits in slot k % kSlots; warp k % kCw computes it (kSlots is a
// multiple of kCw, so each slot has one consumer warp, which takes its rounds in order: a parity wait
// cannot alias).
struct Slots {
  uint32_t base, full, empty, bytes;
  __device__ uint32_t at(uint32_t k) const { return base + (k % kSlots) * bytes; }
  __device__ uint32_t full_bar(uint32_t k) const { return full + 8 * (k % kSlots); }
  __device__ uint32_t empty_bar(uint32_t k) const { return empty + 8 * (k % kSlots); }
  __device__ uint32_t round(uint32_t k) const { return k / kSlots; }
};
__device__ __forceinline__ Slots slots(const Geom& g) {
  return {smem_u32(g_dyn) + g.ring, smem_u32(g_full), smem_u32(g_empty), g.slot_bytes};
}

// Walks units u = lo, lo + 1, ... of an op made of `per`-unit segments (expert slots): seg = u / per,
// c = u % per, without a division per unit.
struct SegWalk {
  int seg, c, per;
  __device__ SegWalk(int lo, int per_) : seg(lo / per_), c(lo % per_), per(per_) {}
  __device__ void next() {
    if (++c == per) {
      c = 0;
      ++seg;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The producer warp: every lane copies 16-byte pieces of each unit's rows, in the consumers' order.

struct Fill {
  const Slots& sl;
  uint64_t pol;
  int lane;
  bool skip;  // timing experiment (variant bit 2): arrive without copying
  // The aligned 16 bytes of a bf16 vector that hold element `row` (a unit's bias rides in its slot).
  __device__ void bias(uint32_t dst, const uint16_t* v, size_t row, int by_lane) const {
    if (lane == by_lane && !skip) cp_async16(dst, v + (row & ~size_t(7)), pol);
  }
  // Waits for slot k to be free; returns its address.
  __device__ uint32_t take(uint32_t k) const {
    const uint32_t r = sl.round(k);
    if (r) mbar_wait(sl.empty_bar(k), (r - 1) & 1);
    return sl.at(k);
  }
  __device__ void copy(uint32_t dst, const void* src, uint32_t bytes) const {
    if (skip) return;
    const uint8_t* s = static_cast<const uint8_t*>(src);
#pragma unroll 4
    for (uint32_t o = 16 * lane; o < bytes; o += 512) cp_async16(dst + o, s + o, pol);
  }
  __device__ void done(uint32_t k) const { cp_async_arrive(sl.full_bar(k)); }
};

// A slot holds the unit's rows, then (MXFP4) their scales, then the bias chunks (16 bytes each).
__device__ __forceinline__ void producer(const DecodeStepParams& p, const Geom& g) {
  const int lane = threadIdx.x & 31, sm = blockIdx.x, nsm = gridDim.x;
  const Shape s(p);
  const Slots sl = slots(g);
  const Fill f{sl, l2_evict_first(), lane, (p.variant & 4) != 0};
  uint32_t k = 0;
  for (int l = 0; l < p.num_layers; ++l) {
    const DecodeStepLayer& L = p.layers[l];
    const unsigned* cnt = p.counters + size_t(l) * kLayerWords;
    const uint32_t kl = k;
    auto stamp_take = [&] {
      if (!lane) unit_stamp(p, l, int(k - kl), 0, global_ns());
    };
    // Unit k: `bytes` of contiguous rows, then the chunk of `bias` holding row `brow`.
    auto rows = [&](const void* src, uint32_t bytes, const uint16_t* bias, size_t brow) {
      const uint32_t dst = f.take(k);
      stamp_take();
      f.copy(dst, src, bytes);
      f.bias(dst + bytes, bias, brow, 0);
      f.done(k);
    };
    // Unit k: eight MXFP4 rows from row0 of a [rows, K] matrix, their scales, their bias chunk.
    auto experts = [&](const uint8_t* blocks, const uint8_t* scales, const uint16_t* bias, size_t row0, int K) {
      const uint32_t dst = f.take(k);
      stamp_take();
      f.copy(dst, blocks + row0 * (K / 2), 4 * K);
      f.copy(dst + 4 * K, scales + row0 * (K / 32), K / 4);
      f.bias(dst + 4 * K + K / 4, bias, row0, 0);
      f.done(k);
    };
    const uint16_t* qkv_w = L.qkv_w;
    Range r = share(s.qkv(), sm, nsm);
    for (SegWalk it(r.lo, s.D / 2); r.lo < r.hi; ++r.lo, ++k, it.next()) {
      const int kvh = it.seg / (body::kAttnG + 2), hh = it.seg % (body::kAttnG + 2), d = it.c;
      const int h = hh < body::kAttnG ? kvh * body::kAttnG + hh : (hh == body::kAttnG ? s.Hq + kvh : s.Hq + s.Hkv + kvh);
      const size_t row = size_t(h * s.D + d);
      const uint16_t* a = qkv_w + row * s.H;
      const uint32_t dst = f.take(k);
      stamp_take();
      f.copy(dst, a, 2 * s.H);
      f.copy(dst + 2 * s.H, a + size_t(s.D / 2) * s.H, 2 * s.H);
      f.bias(dst + 4 * s.H, L.qkv_b, row, 0);
      f.bias(dst + 4 * s.H + 16, L.qkv_b, row + s.D / 2, 1);
      f.done(k);
    }
    const uint16_t* o_w = L.o_w;
    r = share(s.oproj(), sm, nsm);
    for (int u = r.lo; u < r.hi; ++u, ++k) rows(o_w + size_t(u) * s.Kq, 2 * s.Kq, L.o_b, u);
    const uint16_t* router_w = L.router_w;
    r = share(s.router(), sm, nsm);
    for (int u = r.lo; u < r.hi; ++u, ++k) rows(router_w + size_t(2 * u) * s.H, 4 * s.H, L.router_b, 2 * u);

    // The expert weights' addresses need the routing: wait for the router, route the token.
    if (!lane) spin_until(cnt + kCRouter, s.router());
    __syncwarp();
    int sel[kTopK];
    float wt[kTopK];
    body::route_token(p.router_logits, 1, 1, 0, s.E, sel, wt);
    if (!lane) {
      for (int j = 0; j < kTopK; ++j) {
        g_route[l & 1].e[j] = sel[j];
        g_route[l & 1].w[j] = wt[j];
      }
      if (p.trace) p.trace[(size_t(l) * nsm + sm) * kStreamTraceWords + kStreamRouted] = global_ns();
    }
    __syncwarp();  // the route is published to the consumers by the slots' arrivals below

    const uint8_t *up_b = L.up_blocks, *up_s = L.up_scales;
    r = share(kTopK * s.fc1_per(), sm, nsm);
    for (SegWalk it(r.lo, s.fc1_per()); r.lo < r.hi; ++r.lo, ++k, it.next()) {
      const int j = it.seg;
      const size_t row0 =
          size_t(j == 0 ? sel[0] : j == 1 ? sel[1] : j == 2 ? sel[2] : sel[3]) * 2 * s.I + 8 * it.c;
      experts(up_b, up_s, L.up_bias, row0, s.H);
    }
    const uint8_t *down_b = L.down_blocks, *down_s = L.down_scales;
    r = share(kTopK * s.fc2_per(), sm, nsm);
    for (SegWalk it(r.lo, s.fc2_per()); r.lo < r.hi; ++r.lo, ++k, it.next()) {
      const int j = it.seg;
      const size_t row0 = size_t(j == 0 ? sel[0] : j == 1 ? sel[1] : j == 2 ? sel[2] : sel[3]) * s.H + 8 * it.c;
      experts(down_b, down_s, L.down_bias, row0, s.I);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer math on one slot (one warp).

// Two bf16 rows at shared addresses a, b against the staged activations x (natural order), K values.
// Fragment row g is (row a, part g) and g + 8 is (row b, part g); part g is the 32-value segments
// g, g + 8, g + 16, ...; B column g holds x's part g, so C[g][g] and C[g + 8][g] are the partial dots.
// Lanes 2q and 2q + 1 of a quarter warp read adjacent segments: no bank conflicts. Every lane gets
// both dot products (has_b false: no second row; its fragment rows stay zero).
__device__ __forceinline__ float2 dot2_bf16(uint32_t a, uint32_t b, bool has_b, uint32_t x, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int segs = K >> 5, steps = (segs + 7) >> 3;
  // Two accumulators halve the chain of dependent mma's.
  float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr int U = 4;
  for (int s0 = 0; s0 < steps; s0 += U) {
    uint4 wa[U], wb[U], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int seg = 8 * (s0 + u) + g;
      const uint32_t off = uint32_t(seg) * 64 + uint32_t(t) * 16;
      const bool ok = s0 + u < steps && seg < segs;
      wa[u] = ok ? lds128(a + off) : make_uint4(0, 0, 0, 0);
      wb[u] = ok && has_b ? lds128(b + off) : make_uint4(0, 0, 0, 0);
      xv[u] = ok ? lds128(x + off) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      mma_16816(u & 1 ? d : c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[u].x, xv[u].y);
      mma_16816(u & 1 ? c : d, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[u].z, xv[u].w);
    }
  }
  const bool mine = t == (g >> 1);  // C[g][g] and C[g + 8][g] live in lane (g, g / 2)
  const bool odd = g & 1;
  const float ra = odd ? c[1] + d[1] : c[0] + d[0], rb = odd ? c[3] + d[3] : c[2] + d[2];
  return make_float2(warp_sum(mine ? ra : 0.f), warp_sum(mine ? rb : 0.f));
}

// Eight MXFP4 rows (blocks at `blk`, K/2 bytes each, then their scales at `scl`, K/32 bytes each)
// against the staged activations x (MXFP4 order, padded groups). Fragment row g is (row g/2, part
// g&1) and g + 8 is (row 4 + g/2, part g&1); part p is the 128-value segments p, p + 2, ...; B columns
// 0 and 1 hold x's parts. Returns, in lanes with t == 0, the dots of rows g/2 and 4 + g/2.
template <bool kMul>
__device__ __forceinline__ float2 dot8_mxfp4(uint32_t blk, uint32_t scl, uint32_t x, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, part = g & 1;
  const int groups = K >> 5, segs = (groups + 3) >> 2, steps = (segs + 1) >> 1;
  const uint32_t ra = uint32_t(g >> 1), rb = ra + 4;
  const uint32_t a0 = blk + ra * (K >> 1), b0 = blk + rb * (K >> 1), sa = scl + ra * groups, sb = scl + rb * groups;
  // Two accumulators (even / odd steps) halve the chain of dependent mma's.
  float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
  for (int s = 0; s < steps; ++s) {
    const int G = 4 * (2 * s + part) + t;
    const bool ok = G < groups;
    const uint4 wa = ok ? lds128(a0 + 16 * G) : make_uint4(0, 0, 0, 0);
    const uint4 wb = ok ? lds128(b0 + 16 * G) : make_uint4(0, 0, 0, 0);
    const uint32_t ma = ok ? e8m0_mult(lds_u8(sa + G)) : 0u, mb = ok ? e8m0_mult(lds_u8(sb + G)) : 0u;
    const uint32_t xg = x + uint32_t(min(G, groups - 1)) * kXGroupBytes;  // finite where A is zero
    uint4 xv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) xv[q] = lds128(xg + 16 * q);
    group_mxfp4_x<kMul>(wa, wb, ma, mb, xv, s & 1 ? d : c);
  }
  const bool odd = g & 1;  // useful in lane (g, 0): column g & 1
  float pa = odd ? c[1] + d[1] : c[0] + d[0], pb = odd ? c[3] + d[3] : c[2] + d[2];
  pa += __shfl_xor_sync(0xffffffffu, pa, 4);  // the other part of the same rows: lane (g ^ 1, 0)
  pb += __shfl_xor_sync(0xffffffffu, pb, 4);
  return make_float2(pa, pb);
}

// ---------------------------------------------------------------------------------------------
// Consumer staging (all consumer threads; ends with a consumer barrier).

__device__ __forceinline__ void consumers_sync() { named_barrier(kBarConsumers, kCt); }

// rmsnorm(x + sum_j y[j]) * gamma as bf16, in natural order (at 0) and / or MXFP4 order (at perm);
// x_out (if set) receives the summed residual.
__device__ __noinline__ void stage_norm(const float* x, const float* y, const uint16_t* gamma, float eps, int H,
                                        bool nat, bool perm, float* x_out, uint32_t perm_off) {
  const int ctid = threadIdx.x, lane = ctid & 31;
  float v[2][8];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int k = (ctid + c * kCt) * 8;
    if (k >= H) continue;
    const float4 a = __ldcg(reinterpret_cast<const float4*>(x + k)), b = __ldcg(reinterpret_cast<const float4*>(x + k + 4));
    v[c][0] = a.x; v[c][1] = a.y; v[c][2] = a.z; v[c][3] = a.w; v[c][4] = b.x; v[c][5] = b.y; v[c][6] = b.z; v[c][7] = b.w;
    if (y)
      for (int j = 0; j < kTopK; ++j) {  // the experts in slot order, as the other paths sum them
        const float4 e = __ldcg(reinterpret_cast<const float4*>(y + size_t(j) * H + k));
        const float4 f = __ldcg(reinterpret_cast<const float4*>(y + size_t(j) * H + k + 4));
        v[c][0] += e.x; v[c][1] += e.y; v[c][2] += e.z; v[c][3] += e.w;
        v[c][4] += f.x; v[c][5] += f.y; v[c][6] += f.z; v[c][7] += f.w;
      }
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[c][i] * v[c][i];
  }
  ss = warp_sum(ss);
  if (lane == 0) g_red[ctid >> 5] = ss;
  consumers_sync();
  float tot = 0.f;
  for (int w = 0; w < kCw; ++w) tot += g_red[w];
  const float inv = rsqrtf(tot / H + eps);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int k = (ctid + c * kCt) * 8;
    if (k >= H) continue;
    if (x_out) {
      reinterpret_cast<float4*>(x_out + k)[0] = make_float4(v[c][0], v[c][1], v[c][2], v[c][3]);
      reinterpret_cast<float4*>(x_out + k)[1] = make_float4(v[c][4], v[c][5], v[c][6], v[c][7]);
    }
    const uint4 gw4 = *reinterpret_cast<const uint4*>(gamma + k);
    const uint32_t gw[4] = {gw4.x, gw4.y, gw4.z, gw4.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[c][2 * i] = bf16_lo(gw[i]) * (v[c][2 * i] * inv);
      v[c][2 * i + 1] = bf16_hi(gw[i]) * (v[c][2 * i + 1] * inv);
    }
    if (nat) *reinterpret_cast<uint4*>(g_dyn + 2 * k) = pack8(v[c], false);
    if (perm) *reinterpret_cast<uint4*>(g_dyn + perm_off + 2 * staged_at(k)) = pack8(v[c], true);
  }
  consumers_sync();
}

// K bf16 values from global into shared memory at byte offset `off`, natural or MXFP4 order.
__device__ __noinline__ void stage_bf16(const uint16_t* src, int K, uint32_t off, bool permute) {
  for (int i = threadIdx.x; i < K / 8; i += kCt) {
    uint4 w = __ldcg(reinterpret_cast<const uint4*>(src) + i);
    if (permute) {  // bf16 pairs (0,1)(2,3)(4,5)(6,7) -> (0,4)(1,5)(2,6)(3,7), the MXFP4 order
      const uint32_t a = __byte_perm(w.x, w.z, 0x5410), b = __byte_perm(w.x, w.z, 0x7632);
      const uint32_t c = __byte_perm(w.y, w.w, 0x5410), d = __byte_perm(w.y, w.w, 0x7632);
      w = make_uint4(a, b, c, d);
    }
    *reinterpret_cast<uint4*>(g_dyn + off + 2 * (permute ? staged_at(8 * i) : 8 * i)) = w;
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer bookkeeping of one warp.

// Lane 0 writes every unit's outputs, then counts them on the op's counter; counts for one counter
// are released together (flushed when the counter changes and at the end of the op), so a warp
// publishes its run of units with one release instead of one per unit.
struct Counts {
  unsigned* c = nullptr;
  unsigned n = 0;
  __device__ void add(unsigned* to) {
    if (to != c) flush();
    c = to;
    ++n;
  }
  __device__ void flush() {
    if (n) red_release(c, n);
    n = 0;
    c = nullptr;
  }
};

struct Unit {  // the warp's view of unit k
  const DecodeStepParams& p;
  const Slots& sl;
  uint32_t k, kl;
  int l;
  __device__ uint32_t wait() const {
    mbar_wait(sl.full_bar(k), sl.round(k) & 1);
    if ((threadIdx.x & 31) == 0) unit_stamp(p, l, int(k - kl), 1, global_ns());
    return sl.at(k);
  }
  // The warp has read the slot (its loads fed the reductions before this): the producer may refill it.
  __device__ void free(int kind) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
      mbar_arrive(sl.empty_bar(k));
      unit_stamp(p, l, int(k - kl), 2, global_ns());
      unit_stamp(p, l, int(k - kl), 3, uint64_t(kind) | uint64_t(threadIdx.x >> 5) << 8);
    }
  }
};

// The attention items of this SM (on consumer warps 0..3, with a barrier of their own).
struct AttnTeam {
  __device__ __forceinline__ int tid() const { return threadIdx.x; }
  __device__ __forceinline__ int size() const { return body::kAttnWarps * 32; }
  __device__ __forceinline__ void sync() const { named_barrier(kBarAttn, body::kAttnWarps * 32); }
};
struct AttnWait {
  const unsigned* c;
  unsigned target;
  unsigned long long* waited;  // trace: when the wait was satisfied (null: no trace)
  __device__ __forceinline__ void operator()() const {
    if (threadIdx.x == 0) {
      spin_until(c, target);
      if (waited) *waited = global_ns();
    }
    AttnTeam{}.sync();
  }
};

template <int D>
__device__ __noinline__ void attention_items(const DecodeStepParams& p, int l, unsigned* cnt) {
  const Shape s(p);
  const DecodeStepLayer& L = p.layers[l];
  AttnDecodeParams a;
  a.q = p.q; a.q_stride = s.Hq * D; a.k_cache = L.k_cache; a.v_cache = L.v_cache;
  a.pos = p.pos; a.bt_off = L.window ? p.bt_off_sw : p.bt_off; a.block_tables = p.block_tables;
  a.sinks = L.sinks; a.out = p.attn; a.partials = p.attn_partials; a.tickets = p.attn_tickets;
  a.M = 1; a.Hq = s.Hq; a.Hkv = s.Hkv; a.D = D; a.block_size = p.block_size; a.window = L.window;
  a.kv_stable = true;  // one token: only its own key is written in this step
  const int n = s.Hkv * body::kAttnS;
  if (int(blockIdx.x) < n) stamp(p, l, kStreamAttnStart);
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const int kvh = i % s.Hkv, split = i / s.Hkv;
    unsigned long long* waited =
        p.trace ? p.trace + (size_t(l) * gridDim.x + blockIdx.x) * kStreamTraceWords + kStreamAttnWaited : nullptr;
    const AttnWait wait{cnt + kCQkv + kvh, unsigned(s.qkv_per_kv()), waited};
    if (body::attn_decode<D, body::kAttnG>(a, kvh, 0, 0, split, wait, AttnTeam{})) {
      AttnTeam{}.sync();  // every thread's output written before the count
      if (threadIdx.x == 0) red_release(cnt + kCAttn, 1);
    }
  }
  if (int(blockIdx.x) < n) stamp(p, l, kStreamAttnDone);
}

// Thread 0 waits for the counters, then the consumers pass a barrier together.
__device__ __forceinline__ void consumers_wait(const unsigned* c, unsigned target, const unsigned* c2 = nullptr,
                                               unsigned target2 = 0) {
  if (threadIdx.x == 0) {
    if (c) spin_until(c, target);
    if (c2) spin_until(c2, target2);
  }
  consumers_sync();
}

// Element `row` of a bias chunk the producer put in the slot at `at`.
__device__ __forceinline__ float slot_bias(uint32_t at, size_t row) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(at + 2 * uint32_t(row & 7)));
  return bf(v);
}

template <int D, bool kMul>
__device__ __forceinline__ void consumers(const DecodeStepParams& p, const Geom& gm) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, sm = blockIdx.x, nsm = gridDim.x;
  const Shape s(p);
  const Slots sl = slots(gm);
  const uint32_t x_nat = smem_u32(g_dyn), x_perm = x_nat + gm.perm;
  Counts out;
  uint32_t k = 0;
  const bool math = !(p.variant & 2);  // timing experiment (variant bit 1): no math on the slots
  const int32_t slot_full = p.slot[0], slot_sw = p.slot_sw[0];
  for (int l = 0; l < p.num_layers; ++l) {
    const DecodeStepLayer& L = p.layers[l];
    unsigned* cnt = p.counters + size_t(l) * kLayerWords;
    float* xin = l % 2 ? p.xb : p.xa;
    float* xout = l % 2 ? p.xa : p.xb;
    const uint32_t kl = k;

    // qkv: rows d and d + D/2 of a head, RoPE on q and k, k and v into the cache.
    consumers_wait(l ? cnt - kLayerWords + kCFc2 : nullptr, kTopK * s.fc2_per());
    stage_norm(xin, l ? p.y_slot : nullptr, L.attn_norm, p.eps, s.H, true, false, sm == 0 ? xout : nullptr, gm.perm);
    // The summed residual SM 0 wrote is what the o-proj accumulates into; SM 0 may have no qkv unit
    // whose count would publish it.
    if (sm == 0 && threadIdx.x == 0) red_release(cnt + kCResid, 1);
    stamp(p, l, kStreamQkvReady);
    {
      uint16_t *kc = L.k_cache, *vc = L.v_cache;
      const int32_t slot = L.window ? slot_sw : slot_full;
      const Range r = share(s.qkv(), sm, nsm);
      SegWalk it(r.lo, s.D / 2);  // segment = head in KV-group order, c = rotary dim
      for (int u = r.lo; u < r.hi; ++u, ++k, it.next()) {
        if (int(k % kCw) != w) continue;
        const Unit un{p, sl, k, kl, l};
        const int kvh = it.seg / (body::kAttnG + 2), hh = it.seg % (body::kAttnG + 2), d = it.c;
        const int h =
            hh < body::kAttnG ? kvh * body::kAttnG + hh : (hh == body::kAttnG ? s.Hq + kvh : s.Hq + s.Hkv + kvh);
        const int half = s.D / 2, row = h * s.D + d;
        const float2 rope = h < s.Hq + s.Hkv ? g_rope[d] : make_float2(1.f, 0.f);
        const float cs = rope.x, sn = rope.y;
        const uint32_t a = un.wait();
        const float2 v = math ? dot2_bf16(a, a + 2 * s.H, true, x_nat, s.H) : make_float2(0.f, 0.f);
        const float bA = slot_bias(a + 4 * s.H, row), bB = slot_bias(a + 4 * s.H + 16, row + half);
        un.free(0);
        if (lane == 0) {
          float x1 = v.x + bA, x2 = v.y + bB;
          if (h < s.Hq + s.Hkv) {
            const float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
            x1 = y1;
            x2 = y2;
          }
          if (h < s.Hq) {
            p.q[h * s.D + d] = x1;
            p.q[h * s.D + d + half] = x2;
          } else {
            uint16_t* rowp = (h < s.Hq + s.Hkv ? kc : vc) + size_t(slot) * s.Hkv * s.D + kvh * s.D;
            rowp[d] = uint16_t(f32_to_bf16_bits(x1));
            rowp[d + half] = uint16_t(f32_to_bf16_bits(x2));
          }
          out.add(cnt + kCQkv + kvh);
        }
      }
      if (!lane) out.flush();
    }
    if (w < body::kAttnWarps) attention_items<D>(p, l, cnt);

    // o-proj: x_out[u] += W[u] . attn + b[u].
    consumers_wait(cnt + kCAttn, s.Hkv, cnt + kCResid, 1);
    stage_bf16(p.attn, s.Kq, 0, false);
    consumers_sync();
    stamp(p, l, kStreamOprojReady);
    {
      const Range r = share(s.oproj(), sm, nsm);
      for (int u = r.lo; u < r.hi; ++u, ++k) {
        if (int(k % kCw) != w) continue;
        const Unit un{p, sl, k, kl, l};
        const uint32_t a = un.wait();
        const float2 v = math ? dot2_bf16(a, a, false, x_nat, s.Kq) : make_float2(0.f, 0.f);
        const float b = slot_bias(a + 2 * s.Kq, u);
        un.free(1);
        if (lane == 0) {
          xout[u] = __ldcg(xout + u) + v.x + b;
          out.add(cnt + kCOproj);
        }
      }
      if (!lane) out.flush();
    }

    // Router (logits of rows 2u, 2u + 1) and FC1 + SwiGLU, both on the normalized residual.
    consumers_wait(cnt + kCOproj, s.oproj());
    stage_norm(xout, nullptr, L.mlp_norm, p.eps, s.H, true, true, nullptr, gm.perm);
    stamp(p, l, kStreamMlpReady);
    {
      const Range r = share(s.router(), sm, nsm);
      for (int u = r.lo; u < r.hi; ++u, ++k) {
        if (int(k % kCw) != w) continue;
        const Unit un{p, sl, k, kl, l};
        const uint32_t a = un.wait();
        const float2 v = math ? dot2_bf16(a, a + 2 * s.H, true, x_nat, s.H) : make_float2(0.f, 0.f);
        const float b0 = slot_bias(a + 4 * s.H, 2 * u), b1 = slot_bias(a + 4 * s.H, 2 * u + 1);
        un.free(2);
        if (lane == 0) {
          p.router_logits[2 * u] = v.x + b0;
          p.router_logits[2 * u + 1] = v.y + b1;
          out.add(cnt + kCRouter);
        }
      }
      if (!lane) out.flush();
    }
    {
      const Range r = share(kTopK * s.fc1_per(), sm, nsm);
      SegWalk it(r.lo, s.fc1_per());
      for (int u = r.lo; u < r.hi; ++u, ++k, it.next()) {
        if (int(k % kCw) != w) continue;
        const Unit un{p, sl, k, kl, l};
        const int j = it.seg, c = it.c, g = lane >> 2;
        const uint32_t a = un.wait();
        // Row r of the chunk is gate (even r) or up (odd r) of activation 4c + r/2. Lane (g, 0) ends
        // with rows g/2 and 4 + g/2: lanes 0 and 16 finish activations 4c + g/4 and 4c + 2 + g/4,
        // their up rows come from lanes g + 2.
        const bool fin = (lane & 15) == 0;
        const uint32_t bias = a + 4 * s.H + s.H / 4;  // the chunk's eight rows
        const float bg0 = slot_bias(bias, 2 * (g >> 2)), bu0 = slot_bias(bias, 2 * (g >> 2) + 1);
        const float bg1 = slot_bias(bias, 4 + 2 * (g >> 2)), bu1 = slot_bias(bias, 5 + 2 * (g >> 2));
        const float2 v = math ? dot8_mxfp4<kMul>(a, a + 4 * s.H, x_perm, s.H) : make_float2(0.f, 0.f);
        un.free(3);
        const float up0 = __shfl_down_sync(0xffffffffu, v.x, 8), up1 = __shfl_down_sync(0xffffffffu, v.y, 8);
        uint32_t hv[2] = {0u, 0u};
        if (fin) {
          const float gate[2] = {v.x + bg0, v.y + bg1}, up[2] = {up0 + bu0, up1 + bu1};
          for (int q = 0; q < 2; ++q) {
            const float gt = fminf(gate[q], p.limit), upv = fminf(fmaxf(up[q], -p.limit), p.limit);
            const float glu = gt / (1.f + expf(-p.alpha * gt));
            hv[q] = f32_to_bf16_bits(glu * (upv + 1.f));
          }
        }
        // Lane 0 writes activations 4c .. 4c + 3 (its two and lane 16's).
        const uint32_t o0 = __shfl_sync(0xffffffffu, hv[0], 16), o1 = __shfl_sync(0xffffffffu, hv[1], 16);
        if (lane == 0) {
          *reinterpret_cast<uint2*>(p.act + size_t(j) * s.I + 4 * c) =
              make_uint2(hv[0] | (o0 << 16), hv[1] | (o1 << 16));
          out.add(cnt + kCFc1 + j);
        }
      }
      if (!lane) out.flush();
    }

    // FC2 + bias, times the routing weight, into the expert slot's residual term. This SM's units
    // cover at most two expert slots (checked by the launcher); both inputs are staged.
    const Range r2 = share(kTopK * s.fc2_per(), sm, nsm);
    const int j0 = r2.lo / s.fc2_per(), j1 = r2.hi > r2.lo ? (r2.hi - 1) / s.fc2_per() : j0 - 1;
    if (threadIdx.x == 0)
      for (int j = j0; j <= j1; ++j) spin_until(cnt + kCFc1 + j, s.fc1_per());
    consumers_sync();
    for (int j = j0; j <= j1; ++j) stage_bf16(p.act + size_t(j) * s.I, s.I, gm.act + uint32_t(j - j0) * gm.act_bytes, true);
    consumers_sync();
    stamp(p, l, kStreamFc2Ready);
    {
      SegWalk it(r2.lo, s.fc2_per());
      for (int u = r2.lo; u < r2.hi; ++u, ++k, it.next()) {
        if (int(k % kCw) != w) continue;
        const Unit un{p, sl, k, kl, l};
        const int j = it.seg, c = it.c, g = lane >> 2;
        const uint32_t a = un.wait();
        const float wgt = g_route[l & 1].w[j];
        // Lanes (g even, 0) finish rows g/2 and 4 + g/2 of the chunk.
        const uint32_t bias = a + 4 * s.I + s.I / 4;
        const float b0 = slot_bias(bias, g >> 1), b1 = slot_bias(bias, 4 + (g >> 1));
        const uint32_t x = x_nat + gm.act + uint32_t(j - j0) * gm.act_bytes;
        const float2 v = math ? dot8_mxfp4<kMul>(a, a + 4 * s.I, x, s.I) : make_float2(0.f, 0.f);
        un.free(4);
        const float y0 = wgt * (v.x + b0), y1 = wgt * (v.y + b1);
        // Lane 0 writes the chunk's eight rows (rows r and 4 + r sit in lane 8r).
        float y[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          y[q] = __shfl_sync(0xffffffffu, y0, 8 * q);
          y[4 + q] = __shfl_sync(0xffffffffu, y1, 8 * q);
        }
        if (lane == 0) {
          float4* dst = reinterpret_cast<float4*>(p.y_slot + size_t(j) * s.H + 8 * c);
          dst[0] = make_float4(y[0], y[1], y[2], y[3]);
          dst[1] = make_float4(y[4], y[5], y[6], y[7]);
          out.add(cnt + kCFc2);
        }
      }
      if (!lane) out.flush();
    }
    stamp(p, l, kStreamLayerDone);
  }
}

template <int D, bool kMul>
__global__ void __launch_bounds__(kThreads, 1) decode_stream_k(const __grid_constant__ DecodeStepParams p, const Geom gm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x < D / 2) {  // the step's RoPE rotation, once
    float sn, cs;
    sincosf(float(p.pos[0]) * p.inv_freq[threadIdx.x], &sn, &cs);
    g_rope[threadIdx.x] = make_float2(cs * p.concentration, sn * p.concentration);
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSlots; ++i) {
      mbar_init(smem_u32(&g_full[i]), 32);  // one cp.async arrival per producer lane
      mbar_init(smem_u32(&g_empty[i]), 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kCt) producer(p, gm);
  else consumers<D, kMul>(p, gm);
#endif
}

uint32_t align128(size_t v) { return uint32_t((v + 127) & ~size_t(127)); }

// The device's SM count and the dynamic shared memory a CTA of the kernel may take, queried once (the
// kernel's limit is raised to all of it then, so a launch sets nothing).
struct DeviceFit {
  int sms = 0;
  long dyn_max = 0;
};
template <int D, bool kMul>
const DeviceFit& device_fit() {
  static const DeviceFit f = [] {
    int dev = 0, optin = 0;
    DeviceFit r;
    MX_CUDA(cudaGetDevice(&dev));
    MX_CUDA(cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev));
    MX_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes fa{};
    MX_CUDA(cudaFuncGetAttributes(&fa, decode_stream_k<D, kMul>));
    r.dyn_max = long(optin) - long(fa.sharedSizeBytes);
    MX_CUDA(cudaFuncSetAttribute(decode_stream_k<D, kMul>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(r.dyn_max)));
    return r;
  }();
  return f;
}

template <int D, bool kMul>
void launch(const DecodeStepParams& p, cudaStream_t s) {
  const DeviceFit& fit = device_fit<D, kMul>();
  const int sms = fit.sms;
  int per_sm = 0;
  const int H = p.H, I = p.I, Kq = p.Hq * p.D;
  Geom g{};
  g.perm = align128(size_t(std::max(H, Kq)) * 2);
  g.act_bytes = align128(size_t(I / 32) * kXGroupBytes);
  g.act = 0;
  g.ring = std::max(g.perm + align128(size_t(H / 32) * kXGroupBytes), 2 * g.act_bytes);
  // Rows, scales, bias chunks (two for qkv).
  g.slot_bytes = align128(std::max({4 * H + 32, 2 * Kq + 16, 4 * H + H / 4 + 16, 4 * I + I / 4 + 16}));
  const long avail = fit.dyn_max - long(g.ring);
  if (avail < long(kSlots) * long(g.slot_bytes))
    throw_error("decode_stream: shared memory holds " + std::to_string(avail / long(g.slot_bytes)) + " slots, needs " +
                std::to_string(kSlots));
  const size_t dyn = g.ring + size_t(kSlots) * g.slot_bytes;
  MX_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_stream_k<D, kMul>, kThreads, dyn));
  if (per_sm < 1) throw_error("decode_stream: the kernel does not fit on an SM");
  // Each SM's FC2 share must span at most two expert slots (two staged inputs).
  if ((kTopK * (H / 8) + sms - 1) / sms > H / 8) throw_error("decode_stream: too few SMs for the FC2 staging");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(sms);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = dyn;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every CTA resident: the counters' waits need it
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MX_CUDA(cudaLaunchKernelEx(&cfg, decode_stream_k<D, kMul>, p, g));
}

}  // namespace

bool decode_stream_supported(const DecodeStepParams& p, std::string* why) {
  auto no = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return no("no CUDA device");
  if (major < 9) return no("needs sm_90+ (mbarrier-completed copies)");
  if (p.D != 64 && p.D != 16) return no("head_dim " + std::to_string(p.D) + " is not instantiated (16, 64)");
  if (p.Hq != kAttnDecodeGroup * p.Hkv || p.Hkv > 16) return no("needs 8 query heads per KV head, at most 16 KV heads");
  if (p.H % 64 || p.I % 64) return no("hidden and intermediate sizes must be multiples of 64");
  if (p.E % 2 || p.E < kTopK || p.E > 128) return no("needs an even expert count in 4..128");
  if (p.H > 2 * kCt * 8) return no("hidden size too large for the staging");
  return true;
}

size_t decode_stream_trace_words(int num_layers, int sms) {
  return size_t(num_layers) * sms * kStreamTraceWords + size_t(sms) * kStreamTraceUnits * 4;
}

void decode_stream(const DecodeStepParams& p, cudaStream_t s) {
  if (p.M != 1) throw_error("decode_stream: one token per step, got " + std::to_string(p.M));
  std::string why;
  if (!decode_stream_supported(p, &why)) throw_error("decode_stream: " + why);
  MX_CUDA(cudaMemsetAsync(p.counters, 0, decode_step_counter_words(p.num_layers) * 4, s));
  const bool mul = !(p.variant & 1);
  if (p.D == 64) mul ? launch<64, true>(p, s) : launch<64, false>(p, s);
  else mul ? launch<16, true>(p, s) : launch<16, false>(p, s);
}

}  // namespace mx::cuda
