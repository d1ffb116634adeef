// The bespoke attention backward on tensor cores (f16/bf16, head dims 64
// and 128, mma.sync m16n8k16 with f32 accumulators), FlashAttention-2's
// two deterministic passes after the per-row dO . O (kernels_bwd.cu):
// - dK/dV: a block per 64 keys of one key head, 16 keys a warp. The block
//   walks every query head of the key head's group and every 64-row query
//   tile that sees its keys, in order, Q and dO tiles double-buffered by
//   cp.async, and each warp works on its keys' transposed scores, 32 query
//   rows at a time:
//     S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T,
//     dS^T = P^T (dP^T - dO.O) * d score / d raw,
//     dV += (P^T * dropout) dO, dK += dS^T Q,
//   with dK and dV summed in registers (no atomics, a fixed order).
// - dQ: a block per 64 query rows, 16 a warp, Q and dO held in
//   shared memory; K and V tiles double-buffered; S, P, dP and dS recomputed
//   as above, untransposed, and dQ += dS K.
// See Note [Fragments of the transposed products] for the operand layouts.
// Both apply the whole score rule of score.hpp element by element, except on
// tiles every row sees whole with no mask or ALiBi (tile_whole; with dropout,
// keys from a multiple of 16), which take the scale, the softcap and
// dropout's grouped draws inline (grad_score_whole).
#include "attention/backward_tiles.cuh"

namespace baracuda::attn {

// Note [Fragments of the transposed products]
// mma.sync m16n8k16 multiplies A (16 x 16, row) by B (16 x 8, "col": k
// fastest per n). With Q, K, V, dO in shared memory as [row][dim] tiles:
// - an operand whose 16 rows are the M rows (K in S^T = K Q^T, V in dP^T =
//   V dO^T, Q in S = Q K^T) is an A fragment by a plain ldmatrix.x4: lanes
//   0-15 give rows 0-15 at dim 0, lanes 16-31 the same rows at dim 8;
// - an operand contracted over dim (Q in K Q^T, dO in V dO^T, K in Q K^T)
//   is a B fragment by a plain ldmatrix.x4 of its rows (n = row, k = dim);
// - an operand contracted over its rows (dO in P^T dO, Q in dS^T Q, K in
//   dS K) is a B fragment by ldmatrix.x4.trans of [k rows][n dims];
// - an accumulator (P^T, dS^T, dS: rows g and g + 8, columns 2 * quad, +1 of
//   each 8-column tile) becomes the A fragment of the next product by
//   packing two 8-column tiles, as the forward does with P.

namespace {

/// Scratch of the dK/dV kernel: K, V, two stages of Q and dO tiles, and two
/// stages of the query rows' lse (log2 units) and dO . O.
template <int kD>
constexpr size_t kv_smem() {
  return size_t(6 * tc_tile<kD>()) * 2 + 4 * kTcRows * sizeof(float);
}
/// Scratch of the dQ kernel: Q, dO and two stages of K and V tiles.
template <int kD>
constexpr size_t q_smem() {
  return size_t(6 * tc_tile<kD>()) * 2;
}

/// c[0..2 * kD / 16) += a (16 x 16, registers) * tile rows [k0, k0 + 16) x all kD dims (ldmatrix.trans).
template <class T, int kD>
__device__ __forceinline__ void mma_rows(float (&c)[kD / 8][4], const uint32_t (&a)[4], const T* tile, int k0, int lane) {
  constexpr int kPitch = kD + 8;
#pragma unroll
  for (int dp = 0; dp < kD / 16; ++dp) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + dp * 16 + (lane >> 4) * 8);
    mma_16x8x16<T>(c[2 * dp], a, b[0], b[1]);
    mma_16x8x16<T>(c[2 * dp + 1], a, b[2], b[3]);
  }
}

/// The raw scores and dP of the warp's 16 rows against kN rows of the other
/// side (Note [Fragments of the transposed products]): s += A1 B1^T and dp
/// += A2 B2^T over the kD dims, A rows a_row (this lane's ldmatrix row) of
/// sA1, sA2 and B rows [b0, b0 + kN) of sB1, sB2, all [row][kD + 8] tiles.
/// The dK/dV pass takes S^T = K Q^T and dP^T = V dO^T (A: its keys, B: 32
/// query rows), the dQ pass S = Q K^T and dP = dO V^T (A: its rows, B: 64 keys).
template <class T, int kD, int kN>
__device__ __forceinline__ void score_fragments(float (&s)[kN / 8][4], float (&dp)[kN / 8][4], const T* sA1,
                                                const T* sA2, int a_row, const T* sB1, const T* sB2, int b0,
                                                int lane) {
  constexpr int kPitch = kD + 8;
#pragma unroll
  for (int kd = 0; kd < kD / 16; ++kd) {
    uint32_t a1[4], a2[4];
    ldmatrix_x4(a1, sA1 + a_row * kPitch + kd * 16 + (lane / 16) * 8);
    ldmatrix_x4(a2, sA2 + a_row * kPitch + kd * 16 + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      const int brow = (b0 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kPitch + kd * 16 + ((lane >> 3) & 1) * 8;
      uint32_t b1[4], b2[4];
      ldmatrix_x4(b1, sB1 + brow);
      ldmatrix_x4(b2, sB2 + brow);
      mma_16x8x16<T>(s[2 * np], a1, b1[0], b1[1]);
      mma_16x8x16<T>(s[2 * np + 1], a1, b1[2], b1[3]);
      mma_16x8x16<T>(dp[2 * np], a2, b2[0], b2[1]);
      mma_16x8x16<T>(dp[2 * np + 1], a2, b2[2], b2[3]);
    }
  }
}


template <class T, int kD, bool kEdges>
__global__ void __launch_bounds__(kTcThreads) attention_grad_kv_tc(const __grid_constant__ Problem p, const RowStats* ws) {
  constexpr int kTile = tc_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);                  // [64][kD + 8]
  T* sV = sK + kTile;                                  // [64][kD + 8]
  T* const sQ = sV + kTile;  // stage s at sQ + 2 s kTile: Q, then dO (arithmetic: an array would live in local memory)
  float* sS = reinterpret_cast<float*>(sV + 5 * kTile);  // [2][2][64] rows' statistics (stage_row_stats)
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kTcKeys;
  const HeadView first = head_view(p, b, hk * p.group());
  if (!first.valid || k0 >= first.len_kv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int dims = int(p.head_dim);  // kD or less (padded: tc_head_dim)
  const int64_t k_last = min(k0 + kTcKeys, first.len_kv) - 1;
  issue_tile<kD>(sK, p.k.ptr<const T>(b, hk, first.tok_kv), p.k.seq, k0, first.len_kv, dims);
  issue_tile<kD>(sV, p.v.ptr<const T>(b, hk, first.tok_kv), p.v.seq, k0, first.len_kv, dims);

  // Stage s takes query tile (h, i0): Q, dO, and the rows' statistics (stage_row_stats), by cp.async.
  auto load_stage = [&](int s, int64_t h, int64_t i0) {
    issue_tile<kD>(sQ + 2 * s * kTile, p.q.ptr<const T>(b, h, first.tok_q), p.q.seq, i0, first.len_q, dims);
    issue_tile<kD>(sQ + (2 * s + 1) * kTile, p.grad_out.ptr<const T>(b, h, first.tok_q), p.grad_out.seq, i0,
                   first.len_q, dims);
    stage_row_stats(sS + 2 * s * kTcRows, p, first, h, i0, ws);
  };
  int64_t h = hk * p.group(), i0 = 0;
  bool have = next_query_tile(p, first, (hk + 1) * p.group(), k0, k_last, h, i0);
  if (have) load_stage(0, h, i0);
  cp_async_commit();

  const WholeTileRule rule(p);
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};
  const int key_row = warp * 16 + lane % 16;  // this lane's ldmatrix row of the warp's 16 keys
  for (int stage = 0; have; stage ^= 1) {
    int64_t next_h = h, next_i0 = i0 + kTcRows;
    const bool next = next_query_tile(p, first, (hk + 1) * p.group(), k0, k_last, next_h, next_i0);
    if (next) load_stage(stage ^ 1, next_h, next_i0);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* tQ = sQ + 2 * stage * kTile;
    const T* tG = tQ + kTile;
    const float* tS = sS + 2 * stage * kTcRows;
    const HeadView v = group_head_view(p, first, h);

    const TileRule tile_rule = backward_rule<kEdges>(p, v, i0, min(i0 + kTcRows, v.len_q) - 1, k0);
    // The 64 query rows in two halves of 32 (S^T and dP^T of a whole tile
    // beside dK and dV would spill at kD = 128).
#pragma unroll 1
    for (int q0 = 0; q0 < kTcRows; q0 += 32) {
      // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x 32 query rows.
      float s[4][4] = {}, dp[4][4] = {};
      score_fragments<T, kD, 32>(s, dp, sK, sV, key_row, tQ, tG, q0, lane);
      // Element (nt, e): key k0 + warp * 16 + lane / 4 + 8 (e / 2), row i0 + q0 + nt * 8 + 2 quad + (e & 1).
      key_fragment_grads<kEdges>(s, dp, p, v, tile_rule, rule, tS, i0, q0, k0 + warp * 16 + lane / 4, quad);
      // dV += (P^T * dropout) dO and dK += dS^T Q over these 32 rows, 16 at a time.
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t a[4];
        to_a<T>(a, s, kk);
        mma_rows<T, kD>(dv, a, tG, q0 + kk * 16, lane);
        to_a<T>(a, dp, kk);
        mma_rows<T, kD>(dk, a, tQ, q0 + kk * 16, lane);
      }
    }
    __syncthreads();  // this stage is refilled two tiles on
    h = next_h, i0 = next_i0, have = next;
  }
  cp_async_wait<0>();
  write_key_grads<T>(p, first, b, hk, k0 + warp * 16 + lane / 4, dk, dv, quad, dims);
}

template <class T, int kD, bool kEdges>
__global__ void __launch_bounds__(kTcThreads) attention_grad_q_tc(const __grid_constant__ Problem p, const RowStats* ws) {
  constexpr int kTile = tc_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);                 // [64][kD + 8]
  T* sG = sQ + kTile;                                  // [64][kD + 8] dO
  T* const sK = sG + kTile;  // stage s at sK + 2 s kTile: K, then V
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kTcRows;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int dims = int(p.head_dim);  // kD or less (padded: tc_head_dim)
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  const int64_t row_last = min(row0 + kTcRows, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, row_last, span_lo, span_hi);
  issue_tile<kD>(sQ, p.q.ptr<const T>(v.b, v.h, v.tok_q), p.q.seq, row0, v.len_q, dims);
  issue_tile<kD>(sG, p.grad_out.ptr<const T>(v.b, v.h, v.tok_q), p.grad_out.seq, row0, v.len_q, dims);
  if (span_lo < span_hi) {
    issue_tile<kD>(sK, k, p.k.seq, span_lo, v.len_kv, dims);
    issue_tile<kD>(sK + kTile, val, p.v.seq, span_lo, v.len_kv, dims);
  }
  cp_async_commit();
  // Q and dO stay in shared memory (A fragments reread per tile): in
  // registers with dQ, S and dP they would spill at kD = 128.
  const int q_row = warp * 16 + lane % 16;  // this lane's ldmatrix row of the warp's 16 rows

  const GradRows rows(p, v, row0 + warp * 16, ws);  // this thread's rows: g and g + 8 of its warp's 16
  const WholeTileRule rule(p);
  float dq[kDimTiles][4] = {};
  int stage = 0;
  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kTcKeys, stage ^= 1) {
    await_kv_stage<kD>(sK + 2 * (stage ^ 1) * kTile, k, p.k.seq, val, p.v.seq, k0 + kTcKeys, span_hi, v.len_kv, dims);
    const T* tK = sK + 2 * stage * kTile;
    const T* tV = tK + kTile;
    // S = Q K^T and dP = dO V^T: the warp's 16 rows x 64 keys.
    float s[8][4] = {}, dp[8][4] = {};
    score_fragments<T, kD, kTcKeys>(s, dp, sQ, sG, q_row, tK, tV, 0, lane);
    const TileRule tile_rule = backward_rule<kEdges>(p, v, row0, row_last, k0);
    row_fragment_grads<kEdges>(s, dp, p, v, tile_rule, rule, rows, k0, quad);
    // dQ += dS K over the tile's 64 keys, 16 at a time.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      to_a<T>(a, dp, kk);
      mma_rows<T, kD>(dq, a, tK, kk * 16, lane);
    }
    __syncthreads();  // this stage is refilled two tiles on
  }
  cp_async_wait<0>();
  write_query_grads<T>(p, v, rows.row, dq, quad, dims);
}

template <class T, int kD, bool kEdges>
Status launch(const Problem& p, const RowStats* ws, CUstream_st* stream) {
  static_assert(kv_smem<kD>() == tc_backward_smem(kD) && q_smem<kD>() <= kv_smem<kD>(), "the plan checks this much");
  BARACUDA_TRY(launch_pass(attention_grad_q_tc<T, kD, kEdges>, q_smem<kD>(), kTcThreads, p.seq_q, kTcRows, p.heads_q,
                           p, stream, ws));
  return launch_pass(attention_grad_kv_tc<T, kD, kEdges>, kv_smem<kD>(), kTcThreads, p.seq_kv, kTcKeys, p.heads_kv, p,
                     stream, ws);
}

}  // namespace

template <class T>
Status attention_backward_tc(const Problem& p, const RowStats* ws, CUstream_st* stream) {
  if (inline_edges(p))
    return tc_head_dim(p.head_dim) == 64 ? launch<T, 64, true>(p, ws, stream) : launch<T, 128, true>(p, ws, stream);
  return tc_head_dim(p.head_dim) == 64 ? launch<T, 64, false>(p, ws, stream) : launch<T, 128, false>(p, ws, stream);
}
template Status attention_backward_tc<__half>(const Problem&, const RowStats*, CUstream_st*);
template Status attention_backward_tc<__nv_bfloat16>(const Problem&, const RowStats*, CUstream_st*);

}  // namespace baracuda::attn
