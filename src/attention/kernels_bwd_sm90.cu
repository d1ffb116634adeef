// The bespoke attention backward on Hopper's warpgroup MMA (sm_90a; f16/bf16
// at head dims 64 and 128): two deterministic passes, or at head dim 128 one
// pass with dQ summed by bulk f32 reductions.
//
// Note [Hopper backward]
// FlashAttention-2's two deterministic passes after the per-row dO . O
// (kernels_bwd.cu), as the mma.sync kernels of kernels_bwd_tc.cu run them,
// with each block one warpgroup whose products are wgmma's:
// - dK/dV: a block per 64 keys of one key head walks every query head of the
//   key head's group and every 64-row query tile that sees its keys, in
//   order (next_query_tile), Q and dO double-buffered by cp.async in the
//   128-byte swizzled layout (Note [Swizzled tiles and descriptors]):
//     S^T = K Q^T, dP^T = V dO^T   m64n64k16, both operands K-major in shared memory
//     P^T, dS^T                    the score rule's gradient (key_fragment_grads)
//     dV += P^T dO, dK += dS^T Q   m64nDk16, A from registers, B (dO, Q) read N-major
//   dK and dV stay in registers across the walk: no atomics, a fixed order.
// - dQ: a block per 64 query rows, K and V tiles of 64 keys double-buffered:
//     S = Q K^T, dP = dO V^T; dS (row_fragment_grads); dQ += dS K (K read N-major).
// A warpgroup's accumulators give warp w rows 16 w .. 16 w + 15 in the
// layout of mma.sync's m16n8 tiles, so the score code is the mma.sync
// kernels' own (backward_tiles.cuh) and the results are theirs up to the
// order of the f32 sums inside each product. Two blocks an SM at head dim
// 128 (six 64-row tiles, about 97 KiB), three and four at 64 (kv_blocks,
// q_blocks); each block's S^T and dP^T are issued together, and the other
// blocks' products run while it computes its scores. Where TMA takes the
// operands (dense sequences, strides in 16-byte multiples: backward_maps),
// thread 0 loads each stage's pair of tiles (Q and dO, or K and V) by TMA,
// counted on the stage's mbarrier (StageBarriers), and the warps wait on it
// after the stage's block barrier; else every thread issues its cp.async
// share (issue_swizzled). The rows' statistics stay 4-byte cp.async copies.
//
// Note [One-pass Hopper backward]
// Where the plan allows runs that are not bitwise reproducible (the default;
// PlanPreference::deterministic_only keeps the two passes) and the head dim
// is 128, one pass sums dQ too, as FlashAttention-2 and -3 do. A block of
// two warpgroups takes 128 keys (64 each) and walks the query tiles as the
// dK/dV pass does, Q and dO shared by both. Each warpgroup stores its dS^T
// (64 keys x 64 rows) into one swizzled 128 x 64 tile; dK += dS^T Q reads
// its own half K-major, and warpgroup w's part of dQ, dS K over all 128 keys
// for dims 64 w.., reads the whole tile M-major (transposed) with K N-major.
// The part goes through shared memory (64 rows of 72 floats: 8 of padding
// keep the stores off each other's banks) to one bulk f32 reduction into
// the workspace's sums (tiles::kDqPitch), which the dO . O pass zeroes and
// a last pass writes to dQ in its dtype and strides. Order: dV += P^T dO is
// issued before dS^T is stored and dK before the other warpgroup's dS^T is
// waited for, so each overlaps a store or a barrier; the dQ part is waited
// for at the top of the next tile, after its walk and copies are issued
// (B4 H32 S4096 bf16: 364 -> 385 TFLOP/s, D96 274 -> 293). Its wait stays
// outside any branch: ptxas serialises every wgmma of a kernel with a
// wait on a divergent path (C7518). Q and dO run in a ring of three
// stages (tiles::kOnePassStages), so that a tile's dV and dK products are
// waited for there too, not before the next tile's copies are issued
// (385 -> 390, D96 293 -> 297: within a run's spread, one barrier fewer).
// Q and dO come by TMA as in the two passes (each thread's cp.async copies
// were a quarter of the loop's executed instructions; H200 B4 H32 S4096:
// 448 -> 459 TFLOP/s, causal 377 -> 384, softcap 384 -> 396).
// Why 128 keys: the L2 performs reductions at about 1.4-1.5 TB/s of f32
// payload (H200, ncu: float2 or float4 atomics alike). With 64-key blocks
// (a 64 x 128 part per 64 keys, atomics) the one-pass kernel of a B1 H32
// S4096 backward took 3.0 ms, the L2 at 75% of its throughput on them,
// where the two passes take 2.6; 128 keys halve the payload and the bulk
// copy replaces 32 atomics a thread. At head dim 64 one warpgroup would
// carry the whole dQ product (half of a 64-wide N-major part is not a
// canonical layout of this swizzle), which measured slower than two passes.
// The sums' order, so their last bits, vary run to run.
#include "attention/backward_tiles.cuh"
#include "attention/tensor_map.cuh"
#include "attention/wgmma_sm90.cuh"

#include <algorithm>
#include <cmath>
#include <vector>

namespace baracuda::attn {

namespace {

constexpr int kBwdTile = 64;  ///< query rows and keys of a tile
constexpr int kBwdThreads = 128;

/// Blocks an SM of the two passes' kernels (__launch_bounds__). At head dim
/// 64 the dK/dV kernel takes three (168 registers a thread; 32 bytes of
/// spills) and the dQ kernel four (128), against two each before (H200,
/// B4 H32 S4096 bf16: 252 against 220 TFLOP/s, causal 189 against 161; B2
/// H16 S1024: 170 against 147); a dK/dV kernel of four spills 676 bytes.
constexpr int kv_blocks(int d) { return d == 64 ? 3 : 2; }
constexpr int q_blocks(int d) { return d == 64 ? 4 : 2; }

/// Halves of one swizzled 64-row tile.
template <int kD>
constexpr int sw_tile() {
  return kBwdTile * kD;
}

/// Issues d (64 x 64) = A B^T over kD dims: A 64 rows of a swizzled tile of
/// kRowsA rows, B a swizzled tile of 64 rows (K-major).
template <class T, int kD, int kRowsA = kBwdTile>
__device__ __forceinline__ void wgmma_rows_by_rows_issue(float (&d)[8][4], const T* sA, const T* sB) {
  const uint64_t a = sw128_desc(sA, 16), b = sw128_desc(sB, 16);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int step = (kk % 4) * 16;  // column block kk / 4, 32 bytes a step within it
    wgmma_ss_n64<T>(d, desc_plus(a, ((kk / 4) * kRowsA * 64 + step) * sizeof(T)),
                    desc_plus(b, ((kk / 4) * kBwdTile * 64 + step) * sizeof(T)), kk > 0);
  }
}

/// Issues d (64 x kD) += A B over 64 rows: A four register fragments of 16
/// rows each (to_a of a 64 x 64 accumulator), B a swizzled tile of 64 rows
/// by kD dims read N-major.
template <class T, int kD>
__device__ __forceinline__ void wgmma_rows_issue(float (&d)[kD / 8][4], const uint32_t (&a)[4][4], const T* sB) {
  const uint64_t b = sw128_desc(sB, kBwdTile * 128);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs<T, kD>(d, a[kk], desc_plus(b, kk * 16 * 64 * sizeof(T)));
}

/// A 64 x 64 accumulator as four A fragments of 16 columns.
template <class T>
__device__ __forceinline__ void to_fragments(uint32_t (&a)[4][4], const float (&c)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) to_a<T>(a[kk], c, kk);
}

/// Issues the cp.async copies of a key block's K and V rows [k0, k0 + kKeys)
/// of key head hk (swizzled tiles of kKeys rows) for kThreadsT threads.
template <int kD, int kKeys, int kThreadsT, class T>
__device__ __forceinline__ void issue_key_block(T* sK, T* sV, const Problem& p, const HeadView& first, int64_t b,
                                                int64_t hk, int64_t k0) {
  issue_swizzled<kD, kKeys, kThreadsT>(sK, p.k.ptr<const T>(b, hk, first.tok_kv), p.k.seq, k0, first.len_kv,
                                       int(p.head_dim));
  issue_swizzled<kD, kKeys, kThreadsT>(sV, p.v.ptr<const T>(b, hk, first.tok_kv), p.v.seq, k0, first.len_kv,
                                       int(p.value_dim));
}

/// The backward's tensor maps (boxes of 64 rows) where TMA takes the
/// operands: Q and dO (the dK/dV walks' query tiles), K and V (the dQ
/// pass's key tiles).
struct BackwardMaps {
  CUtensorMap q, grad_out, k, v;
};

/// Thread 0's TMA loads of 64 rows (from `row`) of two operands into
/// consecutive swizzled tiles at `dst` (the layout of issue_swizzled),
/// counted on the mbarrier `bar`.
template <class T, int kD>
__device__ __forceinline__ void tma_tile_pair(T* dst, const CUtensorMap& first, const CUtensorMap& second,
                                              int64_t row, int64_t head, int64_t b, uint32_t bar) {
  constexpr int kTile = sw_tile<kD>();
  mbar_expect_tx(bar, 2 * kTile * sizeof(T));
  tma_load_rows<kD, kBwdTile>(dst, &first, row, head, b, bar);
  tma_load_rows<kD, kBwdTile>(dst + kTile, &second, row, head, b, bar);
}

/// Loads query tile (h, i0) into a stage: Q, then dO (sQG, two 64-row
/// tiles), by thread 0's TMA counted on `bar` (kTma) or every thread's
/// cp.async share, and the rows' statistics by cp.async (stage_row_stats).
template <int kD, int kThreadsT, bool kTma, class T>
__device__ __forceinline__ void load_query_stage(T* sQG, float* sS, const Problem& p, const HeadView& first,
                                                 int64_t b, int64_t h, int64_t i0, const RowStats* ws,
                                                 const BackwardMaps& maps, uint32_t bar) {
  if constexpr (kTma) {
    if (threadIdx.x == 0) tma_tile_pair<T, kD>(sQG, maps.q, maps.grad_out, i0, h, b, bar);
  } else {
    issue_swizzled<kD, kBwdTile, kThreadsT>(sQG, p.q.ptr<const T>(b, h, first.tok_q), p.q.seq, i0, first.len_q,
                                            int(p.head_dim));
    issue_swizzled<kD, kBwdTile, kThreadsT>(sQG + sw_tile<kD>(), p.grad_out.ptr<const T>(b, h, first.tok_q),
                                            p.grad_out.seq, i0, first.len_q, int(p.value_dim));
  }
  stage_row_stats(sS, p, first, h, i0, ws);
}

/// The mbarriers of a ring of TMA-loaded stages (one arrival: the loading thread's).
template <int kStages>
struct StageBarriers {
  uint64_t full[kStages];
  __device__ uint32_t operator[](int s) { return shared_address(&full[s]); }
  __device__ void init() {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init((*this)[s], 1);
      mbar_fence_init();
    }
  }
};

template <class T, int kD, bool kEdges, bool kTma>
__global__ void __launch_bounds__(kBwdThreads, kv_blocks(kD))
    attention_grad_kv_sm90(const __grid_constant__ Problem p, const RowStats* ws,
                           const __grid_constant__ BackwardMaps maps) {
#ifdef BARACUDA_WGMMA
  constexpr int kTile = sw_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
  T* sV = sK + kTile;
  T* const sQ = sV + kTile;  // stage s at sQ + 2 s kTile: Q, then dO (arithmetic: an array would live in local memory)
  float* sS = reinterpret_cast<float*>(sV + 5 * kTile);  // [2][2][64] rows' statistics (stage_row_stats)
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kBwdTile;
  const HeadView first = head_view(p, b, hk * p.group());
  if (!first.valid || k0 >= first.len_kv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int64_t k_last = min(k0 + kBwdTile, first.len_kv) - 1;
  issue_key_block<kD, kBwdTile, kBwdThreads>(sK, sV, p, first, b, hk, k0);
  __shared__ __align__(8) StageBarriers<2> full;  // kTma: a stage's Q and dO have landed
  if constexpr (kTma) full.init();

  // Stage s takes query tile (h, i0): Q and dO (by TMA, or cp.async), and the rows' statistics (cp.async).
  auto load_stage = [&](int s, int64_t h, int64_t i0) {
    load_query_stage<kD, kBwdThreads, kTma>(sQ + 2 * s * kTile, sS + 2 * s * kBwdTile, p, first, b, h, i0, ws, maps,
                                            full[s]);
  };
  // The bound is recomputed at each call: held in a register, it made ptxas spill (255 registers at D128: 24 -> 40
  // bytes of spill loads).
  int64_t h = hk * p.group(), i0 = 0;
  bool have = next_query_tile(p, first, (hk + 1) * p.group(), k0, k_last, h, i0);
  if (have) load_stage(0, h, i0);
  cp_async_commit();

  const WholeTileRule rule(p);
  const int64_t key = k0 + warp * 16 + lane / 4;  // this thread's keys: key and key + 8
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};
  uint32_t phase = 0;  // kTma: the parity of this round of the stages' barriers
  for (int stage = 0; have; phase ^= uint32_t(stage), stage ^= 1) {
    int64_t next_h = h, next_i0 = i0 + kBwdTile;
    const bool next = next_query_tile(p, first, (hk + 1) * p.group(), k0, k_last, next_h, next_i0);
    if (next) load_stage(stage ^ 1, next_h, next_i0);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();  // this thread's copies, visible to wgmma
    __syncthreads();
    if constexpr (kTma) mbar_wait(full[stage], phase);  // this tile's Q and dO
    const T* tQ = sQ + 2 * stage * kTile;
    const T* tG = tQ + kTile;
    const HeadView v = group_head_view(p, first, h);

    float s[8][4], dp[8][4];
    wgmma_fence();
    wgmma_rows_by_rows_issue<T, kD>(s, sK, tQ);  // S^T = K Q^T
    wgmma_rows_by_rows_issue<T, kD>(dp, sV, tG);  // dP^T = V dO^T
    wgmma_commit();
    const TileRule tile_rule = backward_rule<kEdges>(p, v, i0, min(i0 + kBwdTile, v.len_q) - 1, k0);
    wgmma_wait<0>();
    wgmma_pin(s);
    wgmma_pin(dp);
    key_fragment_grads<kEdges>(s, dp, p, v, tile_rule, rule, sS + 2 * stage * kBwdTile, i0, 0,
                               key, quad);
    uint32_t pa[4][4], da[4][4];  // P^T (times dropout) and dS^T as A fragments
    to_fragments<T>(pa, s);
    to_fragments<T>(da, dp);
    wgmma_pin(pa);
    wgmma_pin(da);
    wgmma_pin(dv);
    wgmma_pin(dk);
    wgmma_fence();
    wgmma_rows_issue<T, kD>(dv, pa, tG);  // dV += P^T dO
    wgmma_rows_issue<T, kD>(dk, da, tQ);  // dK += dS^T Q
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(dv);
    wgmma_pin(dk);
    wgmma_pin(pa);
    wgmma_pin(da);
    __syncthreads();  // this stage is refilled two tiles on
    h = next_h, i0 = next_i0, have = next;
  }
  cp_async_wait<0>();
  write_key_grads<T>(p, first, b, hk, key, dk, dv, quad, int(p.head_dim));
#endif
}

template <class T, int kD, bool kEdges, bool kTma>
__global__ void __launch_bounds__(kBwdThreads, q_blocks(kD))
    attention_grad_q_sm90(const __grid_constant__ Problem p, const RowStats* ws,
                          const __grid_constant__ BackwardMaps maps) {
#ifdef BARACUDA_WGMMA
  constexpr int kTile = sw_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
  T* sG = sQ + kTile;                       // dO
  T* const sK = sG + kTile;  // stage s at sK + 2 s kTile: K, then V
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kBwdTile;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  const int64_t row_last = min(row0 + kBwdTile, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, row_last, span_lo, span_hi);
  __shared__ __align__(8) StageBarriers<2> full;  // kTma: a stage's K and V have landed
  if constexpr (kTma) full.init();
  auto load_keys = [&](int s, int64_t k0) {
    if constexpr (kTma) {
      if (threadIdx.x == 0) tma_tile_pair<T, kD>(sK + 2 * s * kTile, maps.k, maps.v, k0, v.hk, v.b, full[s]);
    } else {
      issue_swizzled<kD, kBwdTile, kBwdThreads>(sK + 2 * s * kTile, k, p.k.seq, k0, v.len_kv, int(p.head_dim));
      issue_swizzled<kD, kBwdTile, kBwdThreads>(sK + (2 * s + 1) * kTile, val, p.v.seq, k0, v.len_kv,
                                                int(p.value_dim));
    }
  };
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sQ, p.q.ptr<const T>(v.b, v.h, v.tok_q), p.q.seq, row0, v.len_q,
                                            int(p.head_dim));
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sG, p.grad_out.ptr<const T>(v.b, v.h, v.tok_q), p.grad_out.seq, row0,
                                            v.len_q, int(p.value_dim));
  if (span_lo < span_hi) load_keys(0, span_lo);
  cp_async_commit();

  const GradRows rows(p, v, row0 + warp * 16, ws);  // this thread's rows: g and g + 8 of its warp's 16
  const WholeTileRule rule(p);
  float dq[kDimTiles][4] = {};
  int stage = 0;
  uint32_t phase = 0;  // kTma: the parity of this round of the stages' barriers
  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kBwdTile, phase ^= uint32_t(stage), stage ^= 1) {
    if (k0 + kBwdTile < span_hi) load_keys(stage ^ 1, k0 + kBwdTile);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
    if constexpr (kTma) mbar_wait(full[stage], phase);  // this tile's K and V
    const T* tK = sK + 2 * stage * kTile;
    const T* tV = tK + kTile;
    float s[8][4], dp[8][4];
    wgmma_fence();
    wgmma_rows_by_rows_issue<T, kD>(s, sQ, tK);   // S = Q K^T
    wgmma_rows_by_rows_issue<T, kD>(dp, sG, tV);  // dP = dO V^T
    wgmma_commit();
    const TileRule tile_rule = backward_rule<kEdges>(p, v, row0, row_last, k0);
    wgmma_wait<0>();
    wgmma_pin(s);
    wgmma_pin(dp);
    row_fragment_grads<kEdges>(s, dp, p, v, tile_rule, rule, rows, k0, quad);
    uint32_t da[4][4];  // dS as A fragments
    to_fragments<T>(da, dp);
    wgmma_pin(da);
    wgmma_pin(dq);
    wgmma_fence();
    wgmma_rows_issue<T, kD>(dq, da, tK);  // dQ += dS K
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(dq);
    wgmma_pin(da);
    __syncthreads();  // this stage is refilled two tiles on
  }
  cp_async_wait<0>();
  write_query_grads<T>(p, v, rows.row, dq, quad, int(p.head_dim));
#endif
}

// ---------------------------------------------------------------- one pass (Note [One-pass Hopper backward])

constexpr int kOnePassKeys = 128;     ///< keys of a block: 64 a warpgroup
constexpr int kOnePassThreads = 256;  ///< two warpgroups

/// Stores this warpgroup's 64 x 64 accumulator (warp w rows 16 w..) into a swizzled tile of 64 rows of 64 halves.
template <class T>
__device__ __forceinline__ void store_swizzled(T* tile, const float (&c)[8][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4;
  unsigned char* base =
      reinterpret_cast<unsigned char*>(tile) + (threadIdx.x % 128 / 32 * 16 + g) * 128 + 4 * (lane % 4);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)  // rows g and g + 8 share a swizzle (row % 8)
      *reinterpret_cast<uint32_t*>(base + half * 8 * 128 + ((nt ^ g) << 4)) =
          pack2<T>(c[nt][2 * half], c[nt][2 * half + 1]);
}

/// Stores this warpgroup's 64 x kN f32 accumulator into 64 rows of kPitch floats.
template <int kN, int kPitch>
__device__ __forceinline__ void store_rows_f32(float* block, const float (&c)[kN / 8][4]) {
  const int lane = threadIdx.x % 32;
  float* row = block + (threadIdx.x % 128 / 32 * 16 + lane / 4) * kPitch + 2 * (lane % 4);
#pragma unroll
  for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<float2*>(row + half * 8 * kPitch + 8 * nt) = make_float2(c[nt][2 * half], c[nt][2 * half + 1]);
}

/// Issues the dQ part (64 query rows x dims 64 cb..) = dS K over 128 keys: A
/// the whole stored dS^T tile read M-major (transposed; 16 keys a step), B
/// column block cb of the 128-key K tile read N-major.
template <class T>
__device__ __forceinline__ void wgmma_grad_q_part_issue(float (&dq)[8][4], const T* sDS, const T* sK, int cb) {
  const uint64_t a = sw128_desc(sDS, kOnePassKeys * 128);
  const uint64_t b = sw128_desc(sK + cb * kOnePassKeys * 64, kOnePassKeys * 128);
#pragma unroll
  for (int kk = 0; kk < kOnePassKeys / 16; ++kk)
    wgmma_ss<T, 64, 1, 1>(dq, desc_plus(a, kk * 16 * 64 * sizeof(T)), desc_plus(b, kk * 16 * 64 * sizeof(T)), kk > 0);
}

/// dK and dV of a block of 128 keys (64 a warpgroup) and the dQ parts of
/// every query tile it meets (warpgroup w: dims 64 w..), added to the f32
/// sums by bulk reductions; head dim 128. kTma: thread 0 loads each tile's
/// Q and dO by TMA (`maps`), counted on the stage's mbarrier; else every
/// thread copies its share by cp.async.
template <class T, bool kEdges, bool kTma>
__global__ void __launch_bounds__(kOnePassThreads, 1)
    attention_grad_one_pass_sm90(const __grid_constant__ Problem p, const RowStats* ws,
                                 const __grid_constant__ BackwardMaps maps) {
#ifdef BARACUDA_WGMMA
  constexpr int kD = 128, kTile = sw_tile<kD>(), kDimTiles = kD / 8, kPitch = int(kDqPitch);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(swizzle_aligned(smem_raw));  // 128 rows
  T* sV = sK + 2 * kTile;                                   // 128 rows
  T* const sQ = sV + 2 * kTile;  // stage s at sQ + 2 s kTile: Q, then dO (64 rows each)
  T* sDS = sQ + 2 * kOnePassStages * kTile;                        // dS^T: 128 keys by 64 query rows
  float* sDQ = reinterpret_cast<float*>(sDS + kOnePassKeys * 64);  // [2][64][kPitch] dQ parts
  float* sS = sDQ + kDqTileFloats;  // [kOnePassStages][2][64] rows' statistics (stage_row_stats)
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kOnePassKeys;
  const HeadView first = head_view(p, b, hk * p.group());
  if (!first.valid || k0 >= first.len_kv) return;
  // wg and the ring's stage through a shuffle: ptxas then knows them warp-uniform and keeps the wgmma
  // descriptors they feed in uniform registers (before: four R2UR and four moves a wgmma, ~190 instructions a tile).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0), warp = threadIdx.x % 128 / 32,
            lane = threadIdx.x % 32, quad = lane % 4;
  const int64_t k_last = min(k0 + kOnePassKeys, first.len_kv) - 1;
  issue_key_block<kD, kOnePassKeys, kOnePassThreads>(sK, sV, p, first, b, hk, k0);
  __shared__ __align__(8) StageBarriers<kOnePassStages> full;  // kTma: a stage's Q and dO have landed
  if constexpr (kTma) full.init();
  auto load_stage = [&](int s, int64_t h, int64_t i0) {
    load_query_stage<kD, kOnePassThreads, kTma>(sQ + 2 * s * kTile, sS + 2 * s * kBwdTile, p, first, b, h, i0, ws,
                                                maps, full[s]);
  };
  const int64_t h_end = (hk + 1) * p.group();
  int64_t h = hk * p.group(), i0 = 0;
  bool have = next_query_tile(p, first, h_end, k0, k_last, h, i0);
  if (have) load_stage(0, h, i0);
  cp_async_commit();

  const WholeTileRule rule(p);
  const int64_t keys = k0 + 64 * wg;  // this warpgroup's 64 keys
  const int64_t key = keys + warp * 16 + lane / 4;  // this thread's: key and key + 8
  const T* sKw = sK + 64 * wg * 64;  // the warpgroup's rows of the 128-row tiles (column block 0)
  const T* sVw = sV + 64 * wg * 64;
  T* sDSw = sDS + 64 * wg * 64;
  const bool issues = threadIdx.x % 128 == 0;  // the thread that hands the warpgroup's dQ part to the TMA unit
  float* part = sDQ + wg * 64 * kPitch;
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};
  // A tile's dQ part is issued last and waited for after the next tile's
  // walk and copies are issued: `dq` carries it across the loop's back
  // edge, for the tile (dq_h, dq_i0).
  float dq[8][4];
  uint32_t pa[4][4], da[4][4];  // P^T (times dropout) and dS^T as A fragments: read by dV's and dK's wgmmas until
                                // the next tile's wait
  bool dq_pending = false;
  int64_t dq_h = h, dq_i0 = 0;
  auto wait_last_tile = [&] {  // its dV, dK and dQ part (unconditional: a wait in a branch serialises every wgmma)
    wgmma_wait<0>();
    wgmma_pin(dq);
    wgmma_pin(dv);
    wgmma_pin(dk);
    wgmma_pin(pa);
    wgmma_pin(da);
  };
  auto reduce_dq_part = [&] {  // the part, stored and visible to the async proxy in every thread: add it to the sums
    if (issues) {
      bulk_reduce_add_f32(p.grad_q_sum + grad_q_sum_index(p, group_head_view(p, first, dq_h), dq_i0, wg * 64), part,
                          64 * kPitch * 4);
      bulk_commit();
    }
  };
  uint32_t phase = 0;  // kTma: the parity of this round of the ring's full barriers
  for (int ring = 0; have; ring = ring + 1 == kOnePassStages ? 0 : ring + 1, phase ^= uint32_t(ring == 0)) {
    const int stage = __shfl_sync(0xffffffffu, ring, 0);  // uniform, as wg
    int64_t next_h = h, next_i0 = i0 + kBwdTile;
    const bool next = next_query_tile(p, first, h_end, k0, k_last, next_h, next_i0);
    // Into the stage two tiles back, whose readers were waited for at the top of the last tile.
    if (next) load_stage(stage + 1 == kOnePassStages ? 0 : stage + 1, next_h, next_i0);
    cp_async_commit();
    wait_last_tile();
    if (dq_pending) store_rows_f32<64, kPitch>(part, dq);
    cp_async_wait<1>();
    fence_proxy_async();  // this thread's copies, visible to wgmma; its part, to the bulk copy
    __syncthreads();  // this stage landed; both parts written, so dS^T (and the last tile's stage) is free
    if (dq_pending) reduce_dq_part();
    if constexpr (kTma) mbar_wait(full[stage], phase);  // this tile's Q and dO
    const T* tQ = sQ + 2 * stage * kTile;
    const T* tG = tQ + kTile;
    const HeadView v = group_head_view(p, first, h);

    float s[8][4], dp[8][4];
    wgmma_fence();
    wgmma_rows_by_rows_issue<T, kD, kOnePassKeys>(s, sKw, tQ);   // S^T = K Q^T
    wgmma_rows_by_rows_issue<T, kD, kOnePassKeys>(dp, sVw, tG);  // dP^T = V dO^T
    wgmma_commit();
    const TileRule tile_rule = backward_rule<kEdges>(p, v, i0, min(i0 + kBwdTile, v.len_q) - 1, keys);
    wgmma_wait<0>();
    wgmma_pin(s);
    wgmma_pin(dp);
    key_fragment_grads<kEdges>(s, dp, p, v, tile_rule, rule, sS + 2 * stage * kBwdTile, i0, 0,
                               key, quad);
    to_fragments<T>(pa, s);
    to_fragments<T>(da, dp);
    wgmma_pin(pa);
    wgmma_pin(da);
    wgmma_pin(dv);
    wgmma_pin(dk);
    wgmma_fence();
    wgmma_rows_issue<T, kD>(dv, pa, tG);  // dV += P^T dO, while dS^T is stored
    wgmma_rows_issue<T, kD>(dk, da, tQ);  // dK += dS^T Q, from registers
    wgmma_commit();
    store_swizzled<T>(sDSw, dp);  // dS^T for dQ (read M-major)
    if (issues) bulk_wait_read<0>();  // the last part has left shared memory
    fence_proxy_async();
    __syncthreads();  // both warpgroups' dS^T written, both parts free
    wgmma_fence();
    wgmma_grad_q_part_issue<T>(dq, sDS, sK, wg);  // dQ part = dS K, dims 64 wg..
    wgmma_commit();
    dq_pending = true, dq_h = h, dq_i0 = i0;
    h = next_h, i0 = next_i0, have = next;
  }
  cp_async_wait<0>();  // K and V, when no tile sees these keys
  wait_last_tile();
  if (dq_pending) {
    store_rows_f32<64, kPitch>(part, dq);
    fence_proxy_async();
    named_sync(1 + wg, 128);
    reduce_dq_part();
  }
  write_key_grads<T>(p, first, b, hk, key, dk, dv, quad, int(p.head_dim));
  // The last part read out of shared memory before the block leaves; its sums land before the grid completes, and
  // the kernel that reads them runs after. Waiting for the sums themselves held the block's SM (ncu: 6% of the
  // stall samples, at that wait).
  if (issues) bulk_wait_read<0>();
#endif
}

/// The tensor maps of Q and dO (`keys` false) or of K and V (true), where
/// TMA takes both: dense sequences (a packed one's rows past its length
/// belong to the next, not zeros), strides in 16-byte multiples.
template <class T>
bool backward_maps(BackwardMaps& maps, const Problem& p, bool keys) {
  if (p.varlen()) return false;
  return keys ? make_tensor_map<T>(maps.k, p.k, p.batch, p.heads_kv, p.seq_kv, p.head_dim, kBwdTile) &&
                    make_tensor_map<T>(maps.v, p.v, p.batch, p.heads_kv, p.seq_kv, p.value_dim, kBwdTile)
              : make_tensor_map<T>(maps.q, p.q, p.batch, p.heads_q, p.seq_q, p.head_dim, kBwdTile) &&
                    make_tensor_map<T>(maps.grad_out, p.grad_out, p.batch, p.heads_q, p.seq_q, p.value_dim, kBwdTile);
}

/// The one pass (head dim 128) or the two passes (dQ, then dK and dV), each
/// kernel with its tiles by TMA where backward_maps takes them.
template <class T, int kD, bool kEdges>
Status launch(const Problem& p, const RowStats* ws, CUstream_st* stream) {
  BackwardMaps maps{};
  const bool query_tma = backward_maps<T>(maps, p, false);
  if constexpr (kD == 128)
    if (p.grad_q_sum)  // one pass (Note [One-pass Hopper backward]); the caller writes dQ from the sums
      return launch_pass(query_tma ? attention_grad_one_pass_sm90<T, kEdges, true>
                                   : attention_grad_one_pass_sm90<T, kEdges, false>,
                         wgmma_one_pass_smem(), kOnePassThreads, p.seq_kv, kOnePassKeys, p.heads_kv, p, stream, ws,
                         maps);
  const bool key_tma = backward_maps<T>(maps, p, true);
  constexpr size_t smem = wgmma_backward_smem(kD);
  BARACUDA_TRY(launch_pass(key_tma ? attention_grad_q_sm90<T, kD, kEdges, true>
                                   : attention_grad_q_sm90<T, kD, kEdges, false>,
                           smem, kBwdThreads, p.seq_q, kBwdTile, p.heads_q, p, stream, ws, maps));
  return launch_pass(query_tma ? attention_grad_kv_sm90<T, kD, kEdges, true>
                               : attention_grad_kv_sm90<T, kD, kEdges, false>,
                     smem, kBwdThreads, p.seq_kv, kBwdTile, p.heads_kv, p, stream, ws, maps);
}

// ---------------------------------------------------------------- self-test

/// One warpgroup: the one-pass backward's two products, with its issue
/// functions, on a dS^T tile [128 keys][64 rows], Q [64][128] and K
/// [128][128]: dK for each half of the keys from dS^T in registers (as the
/// kernel's accumulator, [128][128] out) and the dQ part for each column
/// block from dS^T stored ([64][128] out), in f32.
template <class T>
__global__ void __launch_bounds__(128)
    transposed_probe(const T* ds_t, const T* q, const T* k, float* dk_out, float* dq_out) {
#ifdef BARACUDA_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sDS = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
  T* sQ = sDS + kOnePassKeys * 64;
  T* sK = sQ + kBwdTile * 128;
  issue_swizzled<64, kOnePassKeys, 128>(sDS, ds_t, 64, 0, kOnePassKeys);
  issue_swizzled<128, kBwdTile, 128>(sQ, q, 128, 0, kBwdTile);
  issue_swizzled<128, kOnePassKeys, 128>(sK, k, 128, 0, kOnePassKeys);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  for (int w = 0; w < 2; ++w) {
    float c[8][4], dk[16][4] = {}, dq[8][4];  // c: this thread's dS^T accumulator elements, keys 64 w..
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e)
        c[n][e] = float(ds_t[(64 * w + warp * 16 + g + 8 * (e / 2)) * kBwdTile + 8 * n + 2 * quad + e % 2]);
    uint32_t a[4][4];
    to_fragments<T>(a, c);
    wgmma_fence();
    wgmma_rows_issue<T, 128>(dk, a, sQ);  // the kernel's dK: dS^T from registers
    wgmma_grad_q_part_issue<T>(dq, sDS, sK, w);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(dk);
    wgmma_pin(dq);
    for (int n = 0; n < 16; ++n)
      for (int e = 0; e < 4; ++e)
        dk_out[(64 * w + warp * 16 + g + 8 * (e / 2)) * 128 + 8 * n + 2 * quad + e % 2] = dk[n][e];
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e)
        dq_out[(warp * 16 + g + 8 * (e / 2)) * 128 + 64 * w + 8 * n + 2 * quad + e % 2] = dq[n][e];
  }
#endif
}

/// Small integers so that every product and sum is exact in f32.
template <class T>
Result<WgmmaBackwardCheck> run_transposed_probe() {
  constexpr int kKeys = kOnePassKeys, kRows = kBwdTile, kD = 128;
  std::vector<float> fds(kKeys * kRows), fq(kRows * kD), fk(kKeys * kD);
  for (size_t i = 0; i < fds.size(); ++i) fds[i] = float(int(i * 7 % 5) - 2);
  for (size_t i = 0; i < fq.size(); ++i) fq[i] = float(int(i * 11 % 5) - 2);
  for (size_t i = 0; i < fk.size(); ++i) fk[i] = float(int(i * 13 % 3) - 1);
  auto to_t = [](const std::vector<float>& f) {
    std::vector<T> t(f.size());
    for (size_t i = 0; i < f.size(); ++i) t[i] = convert<T>(f[i]);
    return t;
  };
  const std::vector<T> ds_t = to_t(fds), q = to_t(fq), k = to_t(fk);
  std::vector<float> dk(kKeys * kD), dq(kRows * kD);
  BARACUDA_TRY(run_probe_kernel(transposed_probe<T>, (ds_t.size() + q.size() + k.size()) * sizeof(T) + 1024, ds_t,
                                q, k, dk, dq));
  auto error = [](double got, double want) { return std::isnan(got) ? INFINITY : std::abs(got - want); };
  WgmmaBackwardCheck check;
  for (int j = 0; j < kKeys; ++j)  // dK = dS^T Q
    for (int d = 0; d < kD; ++d) {
      double want = 0;
      for (int i = 0; i < kRows; ++i) want += double(fds[j * kRows + i]) * fq[i * kD + d];
      check.grad_k = std::max(check.grad_k, error(dk[j * kD + d], want));
    }
  for (int i = 0; i < kRows; ++i)  // dQ = dS K
    for (int d = 0; d < kD; ++d) {
      double want = 0;
      for (int j = 0; j < kKeys; ++j) want += double(fds[j * kRows + i]) * fk[j * kD + d];
      check.grad_q = std::max(check.grad_q, error(dq[i * kD + d], want));
    }
  return check;
}

}  // namespace

template <class T>
Status attention_backward_wgmma(const Problem& p, const RowStats* ws, CUstream_st* stream) {
  if (inline_edges(p))
    return tc_head_dim(p.head_dim) == 64 ? launch<T, 64, true>(p, ws, stream) : launch<T, 128, true>(p, ws, stream);
  return tc_head_dim(p.head_dim) == 64 ? launch<T, 64, false>(p, ws, stream) : launch<T, 128, false>(p, ws, stream);
}
template Status attention_backward_wgmma<__half>(const Problem&, const RowStats*, CUstream_st*);
template Status attention_backward_wgmma<__nv_bfloat16>(const Problem&, const RowStats*, CUstream_st*);

Result<WgmmaBackwardCheck> wgmma_backward_self_test(DType dtype) {
  if (dtype != DType::f16 && dtype != DType::bf16)
    return invalid("wgmma_backward_self_test: f16 or bf16, got ", dtype_name(dtype));
  return dtype == DType::f16 ? run_transposed_probe<__half>() : run_transposed_probe<__nv_bfloat16>();
}

}  // namespace baracuda::attn
