// Body of the decode attention (see attention_decode.h) as a device function, shared by its own grid
// (attention_decode.cu) and the persistent decode step (kernels/decode/decode_step.cu).
#pragma once
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/kv_fp8.cuh"
#include "kernels/common/l2_prefetch.cuh"

namespace mx::cuda::body {

constexpr int kAttnG = kAttnDecodeGroup, kAttnS = kAttnDecodeSplits, kAttnWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ int atomic_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint16_t attn_to_bf(float f) {
  const uint32_t u = __float_as_uint(f);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The threads that run one attention item: a whole CTA of kAttnWarps warps (the per-op grid and the
// persistent step). The item's warps are tid() / 32 = 0 .. kAttnWarps - 1.
struct CtaTeam {
  __device__ __forceinline__ int tid() const { return threadIdx.x; }
  __device__ __forceinline__ int size() const { return blockDim.x; }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// The last split's CTA of a (token, KV head, head group) merges the splits' partials (part: the record
// of that token and KV head) with the sink and writes the output. The merge is on the layer's critical
// path, so it takes one L2 round trip: each thread owns a float4 column of the group's output and every
// R-th split (R = threads / columns), and issues those loads together with the team's (max, sum) loads;
// the R partial sums then add up in a fixed order.
template <int D, int GH, class Team>
__device__ __forceinline__ void merge_splits_one_round(const AttnDecodeParams& p, const float* part, int nsplit,
                                                       int kvh, int h0, int n, Team team) {
  constexpr int G = kAttnG, S = kAttnS, kWarps = kAttnWarps;
  constexpr int kT = kWarps * 32, kCols = GH * D / 4, R = kCols >= kT ? 1 : kT / kCols, kB = 12;
  static_assert(kCols <= kT, "one float4 column a thread");
  __shared__ float fm[S][GH], fl[S][GH];
  __shared__ float4 red[R][kCols];
  const int stride = 2 * G + G * D;
  const int col = team.tid() % kCols, r = team.tid() / kCols, h = 4 * col / D;
  const bool active = team.tid() < R * kCols;
  const float* colp = part + 2 * G + h0 * D + 4 * col;
  float4 v[kB];
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    const int sp = r + R * u;
    v[u] = active && sp < nsplit ? __ldcg(reinterpret_cast<const float4*>(colp + size_t(sp) * stride))
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int i = team.tid(); i < nsplit * GH; i += team.size()) {
    const float a = __ldcg(part + size_t(i / GH) * stride + h0 + i % GH);
    const float b = __ldcg(part + size_t(i / GH) * stride + G + h0 + i % GH);
    fm[i / GH][i % GH] = a;
    fl[i / GH][i % GH] = b;
  }
  team.sync();
  const float sink = bf(p.sinks[kvh * G + h0 + h]) * kLog2e;
  float mx = sink;
  for (int sp = 0; sp < nsplit; ++sp) mx = fmaxf(mx, fm[sp][h]);
  auto weight = [&](int sp) { return fm[sp][h] == -INFINITY ? 0.f : exp2f(fm[sp][h] - mx); };
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int sp0 = 0;; sp0 += R * kB) {
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int sp = sp0 + r + R * u;
      if (sp >= nsplit) break;
      const float f = weight(sp);
      acc.x += f * v[u].x;
      acc.y += f * v[u].y;
      acc.z += f * v[u].z;
      acc.w += f * v[u].w;
    }
    if (sp0 + R * kB >= nsplit) break;
#pragma unroll
    for (int u = 0; u < kB; ++u) {  // more splits than one round covers (long contexts)
      const int sp = sp0 + R * kB + r + R * u;
      v[u] = active && sp < nsplit ? __ldcg(reinterpret_cast<const float4*>(colp + size_t(sp) * stride))
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  if (active) red[r][col] = acc;
  team.sync();
  if (team.tid() < kCols) {
    float dn = exp2f(sink - mx);
    for (int sp = 0; sp < nsplit; ++sp) dn += weight(sp) * fl[sp][h];
    float4 t = red[0][col];
    for (int k = 1; k < R; ++k) {
      const float4 o = red[k][col];
      t.x += o.x; t.y += o.y; t.z += o.z; t.w += o.w;
    }
    uint2 o;
    o.x = uint32_t(attn_to_bf(t.x / dn)) | uint32_t(attn_to_bf(t.y / dn)) << 16;
    o.y = uint32_t(attn_to_bf(t.z / dn)) | uint32_t(attn_to_bf(t.w / dn)) << 16;
    *reinterpret_cast<uint2*>(p.out + size_t(n) * p.Hq * D + size_t(kvh * G + h0) * D + 4 * col) = o;
  }
}

// The same merge with (max, sum) of all splits into shared memory first, then the outputs in rounds of
// kMergeBatch splits.
template <int D, int GH, class Team>
__device__ __forceinline__ void merge_splits_batched(const AttnDecodeParams& p, const float* part, int nsplit,
                                                     int kvh, int h0, int n, Team team) {
  constexpr int G = kAttnG, S = kAttnS;
  __shared__ float fm[S][GH], fl[S][GH], den[GH];
  const int stride = 2 * G + G * D;
  for (int i = team.tid(); i < nsplit * GH; i += team.size()) {
    fm[i / GH][i % GH] = __ldcg(part + size_t(i / GH) * stride + h0 + i % GH);
    fl[i / GH][i % GH] = __ldcg(part + size_t(i / GH) * stride + G + h0 + i % GH);
  }
  team.sync();
  if (team.tid() < GH) {
    const int h = team.tid();
    const float sink = bf(p.sinks[kvh * G + h0 + h]) * kLog2e;
    float mx = sink;
    for (int sp = 0; sp < nsplit; ++sp) mx = fmaxf(mx, fm[sp][h]);
    float dn = exp2f(sink - mx);
    for (int sp = 0; sp < nsplit; ++sp) {
      const float f = fm[sp][h] == -INFINITY ? 0.f : exp2f(fm[sp][h] - mx);
      dn += f * fl[sp][h];
      fm[sp][h] = f;  // now the split's weight
    }
    den[h] = dn;
  }
  team.sync();
  // Four outputs per thread, the splits' values loaded kMergeBatch at a time before any is used: the
  // merge is on the critical path of the layer, where a dependent L2 round trip per split adds up. A
  // larger batch costs registers that keep these CTAs from sharing an SM with the qkv kernel's, so they
  // launch later (docs/perf.md).
  constexpr int kMergeBatch = 8;
  for (int i4 = team.tid(); i4 < GH * D / 4; i4 += team.size()) {
    const int i = 4 * i4, h = i / D;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int sp0 = 0; sp0 < nsplit; sp0 += kMergeBatch) {
      float4 v[kMergeBatch];
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u)
        v[u] = sp0 + u < nsplit ? __ldcg(reinterpret_cast<const float4*>(part + size_t(sp0 + u) * stride + 2 * G + h0 * D + i))
                                : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < kMergeBatch; ++u) {
        if (sp0 + u >= nsplit) break;
        const float f = fm[sp0 + u][h];
        acc[0] += f * v[u].x;
        acc[1] += f * v[u].y;
        acc[2] += f * v[u].z;
        acc[3] += f * v[u].w;
      }
    }
    const float dn = den[h];
    uint2 o;
    o.x = uint32_t(attn_to_bf(acc[0] / dn)) | uint32_t(attn_to_bf(acc[1] / dn)) << 16;
    o.y = uint32_t(attn_to_bf(acc[2] / dn)) | uint32_t(attn_to_bf(acc[3] / dn)) << 16;
    *reinterpret_cast<uint2*>(p.out + size_t(n) * p.Hq * D + size_t(kvh * G + h0) * D + i) = o;
  }
}

// Scores are kept in log2 units: q is pre-scaled by log2(e) / sqrt(D).
// CTA (kvh, hg, qi, split): query heads hg * GH .. hg * GH + GH - 1 of KV head kvh's group. GH < 8
// reads each K/V row once per head group (from L2 after the first) but shortens the CTA's chain of
// dependent math, which is what a decode step waits for. Returns true when this call wrote the final
// output of (token qi, KV head kvh, head group hg): the only split, or the last one that merged the
// others. Contains team barriers (team-uniform returns only).
// kFp8: the cache holds E4M3 values (kv_cache.h), widened exactly to fp32 as they are used.
template <int D, int GH, bool kFp8 = false, class Wait, class Team = CtaTeam>
__device__ __forceinline__ bool attn_decode(const AttnDecodeParams& p, int kvh, int hg, int qi, int split,
                                            Wait wait, Team team = {}) {
  constexpr int G = kAttnG, S = kAttnS, kWarps = kAttnWarps;
  static_assert(G % GH == 0, "head groups split the 8 query heads evenly");
  __shared__ float qs[GH][D];
  __shared__ float wm[kWarps][GH], wl[kWarps][GH], wo[kWarps][GH][D];
  __shared__ bool last;
  const int h0 = hg * GH;  // first query head of the group, within the KV head's 8
  // Rows, positions and block tables come from the step's metadata copy, not from the kernel before.
  const int n = p.rows ? p.rows[qi] : qi;
  const int warp = team.tid() >> 5, lane = team.tid() & 31;
  // The per-op grid's CTAs keep the step's metadata and the sinks in L2 (l2_prefetch.cuh). The persistent
  // kernels' items (all 8 heads) read them plainly: the policy makes their step kernel spill more
  // (docs/perf.md).
  constexpr bool kKeep = GH < G;
  auto meta = [&](const int32_t* a) { return kKeep ? ld_keep(a) : *a; };
  if (kKeep && team.tid() == 0) l2_prefetch_keep(p.sinks + kvh * G + h0, GH * 2);  // read after the wait
  const int pos = meta(p.pos + n), lo = p.window > 0 ? max(0, pos - p.window + 1) : 0, nk = pos - lo + 1;
  const int per = max(kWarps * 32, ((nk + S - 1) / S + 31) & ~31);
  const int nsplit = min(S, (nk + per - 1) / per);
  // A split past the context has no keys: it leaves before the wait and is not counted by the ticket,
  // so the merge does not wait for CTAs that may only get an SM once the kernel before has left.
  if (split >= nsplit) return false;
  const int begin = lo + split * per, end = min(pos + 1, begin + per);
  const int kvd = p.Hkv * D;
  const int32_t* bt = p.block_tables + meta(p.bt_off + n);

  // The K row of key c + lane and the V rows of keys c..c+31, all in flight together. With
  // kv_stable, keys before `pos` are final, so the first chunk is issued before pdl_wait (it overlaps
  // the qkv kernel's tail) and only the current key is fetched after it.
  // A lane's K row: D values in kKv16 pieces of 16 bytes; its V pair: 2 values (4 or 2 bytes).
  constexpr int kKv16 = kFp8 ? D / 16 : D / 8;
  auto load_k_row = [&](size_t r, uint4 (&dst)[kKv16]) {
    if constexpr (kFp8) {
      const uint8_t* kp = p.kv.k_fp8() + r * kvd + kvh * D;
#pragma unroll
      for (int i = 0; i < kKv16; ++i) dst[i] = *reinterpret_cast<const uint4*>(kp + 16 * i);
    } else {
      const uint16_t* kp = p.kv.k_bf16() + r * kvd + kvh * D;
#pragma unroll
      for (int i = 0; i < kKv16; ++i) dst[i] = *reinterpret_cast<const uint4*>(kp + 8 * i);
    }
  };
  auto load_v_pair = [&](size_t r) -> uint32_t {
    if constexpr (kFp8) return *reinterpret_cast<const uint16_t*>(p.kv.v_fp8() + r * kvd + kvh * D + 2 * lane);
    else return *reinterpret_cast<const uint32_t*>(p.kv.v_bf16() + r * kvd + kvh * D + 2 * lane);
  };
  uint4 kk[kKv16];
  uint32_t vv[32];
  size_t row = 0;
  bool valid = false;
  auto issue = [&](int c, bool skip_current) {
    const int j = c + lane;
    valid = j < end;
    row = valid ? size_t(meta(bt + j / p.kv.block_size)) * p.kv.block_size + j % p.kv.block_size : 0;
    const bool load_k = valid && !(skip_current && j == pos);
    if constexpr (kFp8) {
      const uint8_t* kp = p.kv.k_fp8() + row * kvd + kvh * D;
#pragma unroll
      for (int i = 0; i < kKv16; ++i) kk[i] = load_k ? *reinterpret_cast<const uint4*>(kp + 16 * i) : make_uint4(0, 0, 0, 0);
    } else {
      const uint16_t* kp = p.kv.k_bf16() + row * kvd + kvh * D;
#pragma unroll
      for (int i = 0; i < kKv16; ++i) kk[i] = load_k ? *reinterpret_cast<const uint4*>(kp + 8 * i) : make_uint4(0, 0, 0, 0);
    }
    const int nv = min(32, end - c);
#pragma unroll
    for (int jj = 0; jj < 32; ++jj) {
      const size_t r = __shfl_sync(0xffffffffu, row, jj);
      const bool load_v = jj < nv && 2 * lane < D && !(skip_current && c + jj == pos);
      vv[jj] = load_v ? load_v_pair(r) : 0u;
    }
  };
  int c0 = begin + warp * 32;
  const bool early = p.kv_stable && c0 < end;
  if (early) issue(c0, true);
  wait();
  if (early && pos < c0 + 32) {  // the current key, written by the kernel before
    if (c0 + lane == pos) load_k_row(row, kk);
    const size_t r = __shfl_sync(0xffffffffu, row, pos - c0);
#pragma unroll
    for (int jj = 0; jj < 32; ++jj)
      if (c0 + jj == pos && 2 * lane < D) vv[jj] = load_v_pair(r);
  }
  // q after the wait (the kernel before wrote it): every thread's loads issued before any store, so
  // the staging is one L2 round trip (a team has at least kWarps warps).
  const float qscale = kLog2e * rsqrtf(float(D));
  constexpr int kQPer = (GH * D + kWarps * 32 - 1) / (kWarps * 32);
  float qv[kQPer];
  const float* qsrc = p.q + size_t(n) * p.q_stride + size_t(kvh * G + h0) * D;
#pragma unroll
  for (int u = 0; u < kQPer; ++u) {
    const int i = team.tid() + u * team.size();
    qv[u] = i < GH * D ? qsrc[i] : 0.f;
  }
#pragma unroll
  for (int u = 0; u < kQPer; ++u) {
    const int i = team.tid() + u * team.size();
    if (i < GH * D) qs[i / D][i % D] = qv[u] * qscale;
  }
  team.sync();

  float m[GH], l[GH], o[GH][2];
  for (int h = 0; h < GH; ++h) { m[h] = -INFINITY; l[h] = 0.f; o[h][0] = o[h][1] = 0.f; }
  for (; c0 < end; c0 += kWarps * 32) {
    if (!early || c0 != begin + warp * 32) issue(c0, false);
    float s[GH];
    for (int h = 0; h < GH; ++h) s[h] = 0.f;
#pragma unroll
    for (int i = 0; i < kKv16; ++i) {
      const uint32_t w[4] = {kk[i].x, kk[i].y, kk[i].z, kk[i].w};
      constexpr int kV = kFp8 ? 16 : 8;  // values in the piece
      float kf[kV];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if constexpr (kFp8) {
          const float2 a = e4m3x2_to_float2(w[u]), b = e4m3x2_to_float2(w[u] >> 16);
          kf[4 * u] = a.x; kf[4 * u + 1] = a.y; kf[4 * u + 2] = b.x; kf[4 * u + 3] = b.y;
        } else {
          kf[2 * u] = __uint_as_float(w[u] << 16); kf[2 * u + 1] = __uint_as_float(w[u] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int h = 0; h < GH; ++h)
#pragma unroll
        for (int u = 0; u < kV; ++u) s[h] += qs[h][kV * i + u] * kf[u];
    }
    float pj[GH];
#pragma unroll
    for (int h = 0; h < GH; ++h) {
      const float sv = valid ? s[h] : -INFINITY;
      const float mn = fmaxf(m[h], warp_max(sv));  // finite: the chunk has a valid key
      const float corr = exp2f(m[h] - mn);
      pj[h] = exp2f(sv - mn);
      l[h] = l[h] * corr + warp_sum(pj[h]);
      o[h][0] *= corr;
      o[h][1] *= corr;
      m[h] = mn;
    }
#pragma unroll
    for (int jj = 0; jj < 32; ++jj) {
      float v0, v1;
      if constexpr (kFp8) {
        const float2 f = e4m3x2_to_float2(vv[jj]);
        v0 = f.x, v1 = f.y;
      } else {
        v0 = __uint_as_float(vv[jj] << 16), v1 = __uint_as_float(vv[jj] & 0xffff0000u);
      }
#pragma unroll
      for (int h = 0; h < GH; ++h) {
        const float w = __shfl_sync(0xffffffffu, pj[h], jj);  // zero past nv (invalid keys)
        o[h][0] += w * v0;
        o[h][1] += w * v1;
      }
    }
  }
  if (lane == 0)
    for (int h = 0; h < GH; ++h) { wm[warp][h] = m[h]; wl[warp][h] = l[h]; }
  if (2 * lane < D)
    for (int h = 0; h < GH; ++h) { wo[warp][h][2 * lane] = o[h][0]; wo[warp][h][2 * lane + 1] = o[h][1]; }
  team.sync();

  if (nsplit == 1) {  // the whole context in this CTA: normalize with the sink and write out
    for (int i = team.tid(); i < GH * D; i += team.size()) {
      const int h = i / D, d = i % D;
      const float sink = bf(p.sinks[kvh * G + h0 + h]) * kLog2e;
      float mx = sink;
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][h]);
      float acc = 0.f, sum = exp2f(sink - mx);
      for (int w = 0; w < kWarps; ++w) {
        const float f = wm[w][h] == -INFINITY ? 0.f : exp2f(wm[w][h] - mx);
        acc += f * wo[w][h][d];
        sum += f * wl[w][h];
      }
      p.out[size_t(n) * p.Hq * D + size_t(kvh * G + h0 + h) * D + d] = attn_to_bf(acc / sum);
    }
    return true;
  }
  // This split's partial: (max, sum, unnormalized output) per head; the head groups write disjoint
  // entries of the (token, KV head)'s record.
  float* part = p.partials + (size_t(qi) * p.Hkv + kvh) * S * (2 * G + G * D);
  float* mine = part + size_t(split) * (2 * G + G * D);
  for (int i = team.tid(); i < GH * D; i += team.size()) {
    const int h = i / D, d = i % D;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][h]);
    float acc = 0.f, sum = 0.f;
    if (mx != -INFINITY)
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(wm[w][h] - mx);
        acc += f * wo[w][h][d];
        sum += f * wl[w][h];
      }
    mine[2 * G + h0 * D + i] = acc;
    if (d == 0) { mine[h0 + h] = mx; mine[G + h0 + h] = sum; }
  }
  // One acquire-release ticket publishes the team's partial (ordered before it by the barrier) and,
  // for the last split, makes the others' visible: no per-thread fences on the critical path.
  team.sync();
  int* ticket = p.tickets + (qi * p.Hkv + kvh) * (G / GH) + hg;
  if (team.tid() == 0) last = atomic_add_acq_rel(ticket, 1) == nsplit - 1;
  team.sync();
  if (!last) return false;
  // The 8-head items of the persistent step keep the batched merge: the one-round merge's registers make
  // that kernel slower at batch 8 (docs/perf.md).
  if constexpr (GH < G) merge_splits_one_round<D, GH>(p, part, nsplit, kvh, h0, n, team);
  else merge_splits_batched<D, GH>(p, part, nsplit, kvh, h0, n, team);
  if (team.tid() == 0) *ticket = 0;  // ready for the next launch / graph replay
  return true;
}

}  // namespace mx::cuda::body
