// The bespoke attention backward on Hopper's warpgroup MMA (sm_90a; f16/bf16
// at head dims 64 and 128).
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
// order of the f32 sums inside each product. Two blocks an SM (six 64-row
// tiles, about 97 KiB at head dim 128); each block's S^T and dP^T are
// issued together, and the other block's products run while it computes
// its scores.
#include "attention/backward_tiles.cuh"
#include "attention/wgmma_sm90.cuh"

namespace baracuda::attn {

namespace {

constexpr int kBwdTile = 64;  ///< query rows and keys of a tile
constexpr int kBwdThreads = 128;

/// Halves of one swizzled 64-row tile.
template <int kD>
constexpr int sw_tile() {
  return kBwdTile * kD;
}

/// Issues d (64 x 64) = A B^T over kD dims: A and B swizzled tiles of 64 rows (K-major).
template <class T, int kD>
__device__ __forceinline__ void wgmma_rows_by_rows_issue(float (&d)[8][4], const T* sA, const T* sB) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int at = (kk / 4) * kBwdTile * 64 + (kk % 4) * 16;  // column block kk / 4, 32 bytes a step within it
    wgmma_ss_n64<T>(d, sw128_desc(sA + at, 16), sw128_desc(sB + at, 16), kk > 0);
  }
}

/// Issues d (64 x kD) += A B over 64 rows: A four register fragments of 16
/// rows each (to_a of a 64 x 64 accumulator), B a swizzled tile of 64 rows
/// by kD dims read N-major.
template <class T, int kD>
__device__ __forceinline__ void wgmma_rows_issue(float (&d)[kD / 8][4], const uint32_t (&a)[4][4], const T* sB) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs<T, kD>(d, a[kk], sw128_desc(sB + kk * 16 * 64, kBwdTile * 128));
}

/// A 64 x 64 accumulator as four A fragments of 16 columns.
template <class T>
__device__ __forceinline__ void to_fragments(uint32_t (&a)[4][4], const float (&c)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) to_a<T>(a[kk], c, kk);
}

template <class T, int kD>
__global__ void __launch_bounds__(kBwdThreads, 2)
    attention_grad_kv_sm90(const __grid_constant__ Problem p, const float* ws) {
#ifdef BARACUDA_WGMMA
  constexpr int kTile = sw_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
  T* sV = sK + kTile;
  T* sQ[2] = {sV + kTile, sV + 3 * kTile};               // stage s: Q, then dO
  float* sL = reinterpret_cast<float*>(sV + 5 * kTile);  // [2][64] lse
  float* sR = sL + 2 * kBwdTile;                         // [2][64] dO . O
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kBwdTile;
  const HeadView first = head_view(p, b, hk * p.group());
  if (!first.valid || k0 >= first.len_kv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int64_t k_last = min(k0 + kBwdTile, first.len_kv) - 1;
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sK, p.k.ptr<const T>(b, hk, first.tok_kv), p.k.seq, k0, first.len_kv);
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sV, p.v.ptr<const T>(b, hk, first.tok_kv), p.v.seq, k0, first.len_kv);

  // Stage s takes query tile (h, i0): Q, dO, and the rows' lse and dO . O (stage_row_stats), by cp.async.
  auto load_stage = [&](int s, int64_t h, int64_t i0) {
    issue_swizzled<kD, kBwdTile, kBwdThreads>(sQ[s], p.q.ptr<const T>(b, h, first.tok_q), p.q.seq, i0, first.len_q);
    issue_swizzled<kD, kBwdTile, kBwdThreads>(sQ[s] + kTile, p.grad_out.ptr<const T>(b, h, first.tok_q),
                                              p.grad_out.seq, i0, first.len_q);
    stage_row_stats(sL + s * kBwdTile, sR + s * kBwdTile, p, first, h, i0, ws);
  };
  int64_t h = hk * p.group(), i0 = 0;
  bool have = next_query_tile(p, first, hk, k0, k_last, h, i0);
  if (have) load_stage(0, h, i0);
  cp_async_commit();

  const WholeTileRule rule(p);
  const int64_t key = k0 + warp * 16 + lane / 4;  // this thread's keys: key and key + 8
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};
  for (int stage = 0; have; stage ^= 1) {
    int64_t next_h = h, next_i0 = i0 + kBwdTile;
    const bool next = next_query_tile(p, first, hk, k0, k_last, next_h, next_i0);
    if (next) load_stage(stage ^ 1, next_h, next_i0);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();  // this thread's copies, visible to wgmma
    __syncthreads();
    const T* tQ = sQ[stage];
    const T* tG = sQ[stage] + kTile;
    const HeadView v = group_head_view(p, first, h);

    float s[8][4], dp[8][4];
    wgmma_fence();
    wgmma_rows_by_rows_issue<T, kD>(s, sK, tQ);  // S^T = K Q^T
    wgmma_rows_by_rows_issue<T, kD>(dp, sV, tG);  // dP^T = V dO^T
    wgmma_commit();
    const TileRule tile_rule = backward_rule(p, v, i0, min(i0 + kBwdTile, v.len_q) - 1, k0);
    wgmma_wait<0>();
    wgmma_pin(s);
    wgmma_pin(dp);
    key_fragment_grads(s, dp, p, v, tile_rule, rule, sL + stage * kBwdTile, sR + stage * kBwdTile, i0, 0, key, quad);
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
  write_key_grads<T>(p, first, b, hk, key, dk, dv, quad, kD);
#endif
}

template <class T, int kD>
__global__ void __launch_bounds__(kBwdThreads, 2)
    attention_grad_q_sm90(const __grid_constant__ Problem p, const float* ws) {
#ifdef BARACUDA_WGMMA
  constexpr int kTile = sw_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
  T* sG = sQ + kTile;                       // dO
  T* sK[2] = {sG + kTile, sG + 3 * kTile};  // stage s: K, then V
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kBwdTile;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  const int64_t row_last = min(row0 + kBwdTile, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, row_last, span_lo, span_hi);
  auto load_keys = [&](int s, int64_t k0) {
    issue_swizzled<kD, kBwdTile, kBwdThreads>(sK[s], k, p.k.seq, k0, v.len_kv);
    issue_swizzled<kD, kBwdTile, kBwdThreads>(sK[s] + kTile, val, p.v.seq, k0, v.len_kv);
  };
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sQ, p.q.ptr<const T>(v.b, v.h, v.tok_q), p.q.seq, row0, v.len_q);
  issue_swizzled<kD, kBwdTile, kBwdThreads>(sG, p.grad_out.ptr<const T>(v.b, v.h, v.tok_q), p.grad_out.seq, row0,
                                            v.len_q);
  if (span_lo < span_hi) load_keys(0, span_lo);
  cp_async_commit();

  const GradRows rows(p, v, row0 + warp * 16, ws);  // this thread's rows: g and g + 8 of its warp's 16
  const WholeTileRule rule(p);
  float dq[kDimTiles][4] = {};
  int stage = 0;
  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kBwdTile, stage ^= 1) {
    if (k0 + kBwdTile < span_hi) load_keys(stage ^ 1, k0 + kBwdTile);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
    const T* tK = sK[stage];
    const T* tV = sK[stage] + kTile;
    float s[8][4], dp[8][4];
    wgmma_fence();
    wgmma_rows_by_rows_issue<T, kD>(s, sQ, tK);   // S = Q K^T
    wgmma_rows_by_rows_issue<T, kD>(dp, sG, tV);  // dP = dO V^T
    wgmma_commit();
    const TileRule tile_rule = backward_rule(p, v, row0, row_last, k0);
    wgmma_wait<0>();
    wgmma_pin(s);
    wgmma_pin(dp);
    row_fragment_grads(s, dp, p, v, tile_rule, rule, rows, k0, quad);
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
  write_query_grads<T>(p, v, rows.row, dq, quad, kD);
#endif
}

template <class T, int kD>
Status launch(const Problem& p, const float* ws, CUstream_st* stream) {
  constexpr size_t smem = wgmma_backward_smem(kD);
  return launch_backward_passes(p, ws, stream, kBwdThreads, {attention_grad_q_sm90<T, kD>, smem, kBwdTile},
                                {attention_grad_kv_sm90<T, kD>, smem, kBwdTile});
}

}  // namespace

template <class T>
Status attention_backward_wgmma(const Problem& p, const float* ws, CUstream_st* stream) {
  return p.head_dim == 64 ? launch<T, 64>(p, ws, stream) : launch<T, 128>(p, ws, stream);
}
template Status attention_backward_wgmma<__half>(const Problem&, const float*, CUstream_st*);
template Status attention_backward_wgmma<__nv_bfloat16>(const Problem&, const float*, CUstream_st*);

}  // namespace baracuda::attn
