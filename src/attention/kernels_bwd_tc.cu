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
#include "attention/tensor_core.cuh"

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

/// A row's lse in log2 units, +inf for a row past the sequence or one that
/// saw no key, so that exp2(score - lse) is 0 there.
__device__ __forceinline__ float row_lse2(const Problem& p, const HeadView& v, int64_t i) {
  if (i >= v.len_q) return INFINITY;
  const float l = *p.lse.ptr<const float>(v.b, v.h, v.tok_q + i);
  return l == -INFINITY ? INFINITY : l * kLog2e;
}

/// dS of row i against key j from the raw products q.k and dO.v under the
/// whole score rule and dropout (x), and the probability times dropout's
/// factor (y: the weight dV takes). lse2: the row's lse in log2 units; rdot:
/// its dO . O. Out of line: the tiles that need it are the few on a mask,
/// window or causal edge (or every tile with ALiBi, softcap or dropout), and
/// inlined into the unrolled tile loop it would cost the plain tiles
/// registers. By value in and out, so that the callers' accumulators stay
/// in registers.
__device__ __noinline__ float2 grad_score_rule(const Problem& p, const HeadView& v, float raw, float dprob, int64_t i,
                                               int64_t j, float lse2, float rdot) {
  float prob = 0, slope = float(p.scale);
  if (i < v.len_q) {
    int64_t lo, hi;
    key_range(p, i, v.len_q, v.len_kv, lo, hi);
    if (j >= lo && j < hi) {
      float capped;
      const float s = score<float>(p, v, raw, i, j, capped);
      prob = fast_exp2(s * kLog2e - lse2);
      slope = score_slope<float>(p, capped);
    }
  }
  if (prob == 0) return make_float2(0.f, 0.f);
  const float z = dropout_factor<float>(p, v, i, j);
  return make_float2(prob * (z * dprob - rdot) * slope, prob * z);
}

/// The constants of the scores on whole tiles (tile_whole): the forward's
/// (ScoreScales), the scale itself and dropout's factor on a kept probability.
struct WholeTileRule : ScoreScales {
  float scale, kept_scale;
  __device__ explicit WholeTileRule(const Problem& p)
      : ScoreScales(p), scale(float(p.scale)), kept_scale(p.dropout_p > 0 ? dropout_scale<float>(p) : 1.f) {}
};

/// A key tile's score code, by the forwards' rules (TileRule): inline on a
/// whole tile (plain, or capped with a softcap: grad_score_whole), else the
/// whole rule element by element (full). With dropout a whole tile also
/// needs its keys from a multiple of 16 (whole dropout groups, Note
/// [Attention dropout draws]).
__device__ __forceinline__ TileRule backward_rule(const Problem& p, const HeadView& v, int64_t row0, int64_t row_last,
                                                  int64_t k0) {
  const bool whole = tile_whole(p, v, row0, row_last, k0, kTcKeys) && (p.dropout_p <= 0 || (k0 & 15) == 0);
  return whole ? inline_rule(p, true) : TileRule::full;
}

/// Dropout keep bits of a dK/dV-pass fragment (bit 4 nt + e: row r + 8 nt +
/// (e % 2), key key + 8 (e / 2)): for each row parity, tiles nt and nt + 1
/// (nt even) hold half a dropout group, one Philox call per 4 scores. r % 16
/// < 7 and key % 16 < 8 (the row and key with bit 3 clear).
template <int kN>
__device__ __forceinline__ uint32_t dropout_bits_keys(const Problem& p, const HeadView& v, int64_t r, int64_t key) {
  static_assert(kN % 2 == 0 && kN * 4 <= 32, "whole groups, one bit a score");
  const uint32_t threshold = dropout_threshold(p.dropout_p);
  uint32_t bits = 0;
#pragma unroll
  for (int nt = 0; nt < kN; nt += 2)
#pragma unroll
    for (int parity = 0; parity < 2; ++parity) {
      const int64_t i = r + nt * 8 + parity;
      const PhiloxWords w = dropout_draws(p, v.b, v.h, i, key);
#pragma unroll
      for (int d = 0; d < 2; ++d)
#pragma unroll
        for (int kh = 0; kh < 2; ++kh)
          bits |= uint32_t(group_draw(w, d, kh, key & 1) >= threshold) << (4 * (nt + d) + 2 * kh + parity);
    }
  return bits;
}

/// dS (x) and P times dropout's factor z (y) on a whole tile (tile_whole):
/// the scale alone, or with kCapped the softcap too (score = cap tanh(scale
/// raw / cap), d score / d raw = scale (1 - tanh^2)), inline where
/// grad_score_rule would pay a call and the key-range test per element.
/// dS = P (z dP - dO.O) d score / d raw.
template <bool kCapped>
__device__ __forceinline__ float2 grad_score_whole(float raw, float dprob, const WholeTileRule& w, float lse2,
                                                   float rdot, float z) {
  if constexpr (kCapped) {
    const float t = fast_tanh(raw * w.scale_over_cap);  // as the forward (tile_scores)
    const float prob = fast_exp2(t * w.cap_log2 - lse2);
    return make_float2(prob * (z * dprob - rdot) * (w.scale * (1.f - t * t)), prob * z);
  } else {
    const float prob = fast_exp2(raw * w.scale_log2 - lse2);
    return make_float2(prob * (z * dprob - rdot) * w.scale, prob * z);
  }
}

/// grad_score_whole over a warp's fragments: dp becomes dS and s becomes P
/// times dropout's factor; lse_rdot(nt, e) gives the element's row lse (log2
/// units) and dO . O; with kDropout, bit 4 nt + e of `kept` says whether
/// dropout keeps the element (dropout_bits_*).
template <bool kCapped, bool kDropout, int kN, class RowOf>
__device__ __forceinline__ void whole_tile_grads(float (&s)[kN][4], float (&dp)[kN][4], const WholeTileRule& w,
                                                 RowOf&& lse_rdot, uint32_t kept) {
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 row = lse_rdot(nt, e);
      const float z = !kDropout ? 1.f : (kept >> (4 * nt + e)) & 1 ? w.kept_scale : 0.f;
      const float2 g = grad_score_whole<kCapped>(s[nt][e], dp[nt][e], w, row.x, row.y, z);
      dp[nt][e] = g.x, s[nt][e] = g.y;
    }
}

/// whole_tile_grads specialised on the softcap (`rule` capped or plain) and
/// dropout; `kept` is read only with dropout.
template <int kN, class RowOf>
__device__ __forceinline__ void whole_tile_grads(TileRule rule, bool dropout, float (&s)[kN][4], float (&dp)[kN][4],
                                                 const WholeTileRule& w, RowOf&& lse_rdot, uint32_t kept) {
  if (rule == TileRule::capped) {
    if (dropout) whole_tile_grads<true, true>(s, dp, w, lse_rdot, kept);
    else whole_tile_grads<true, false>(s, dp, w, lse_rdot, kept);
  } else {
    if (dropout) whole_tile_grads<false, true>(s, dp, w, lse_rdot, kept);
    else whole_tile_grads<false, false>(s, dp, w, lse_rdot, kept);
  }
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

/// Accumulator tiles 2 kk and 2 kk + 1 (16 rows x 16 columns) as an A fragment.
template <class T, int kTiles>
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&c)[kTiles][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/// The next query tile (head h, rows from i0) of key head hk's group that
/// sees a key of [k0, k_last], from (h, i0) on; false when none is left.
__device__ bool next_query_tile(const Problem& p, int64_t b, int64_t hk, int64_t k0, int64_t k_last, int64_t& h,
                                int64_t& i0) {
  for (; h < (hk + 1) * p.group(); ++h, i0 = 0) {
    const HeadView v = head_view(p, b, h);
    for (; i0 < v.len_q; i0 += kTcRows) {
      int64_t lo_first, hi_first, lo_last, hi_last;
      key_range(p, i0, v.len_q, v.len_kv, lo_first, hi_first);
      key_range(p, min(i0 + kTcRows, v.len_q) - 1, v.len_q, v.len_kv, lo_last, hi_last);
      if (hi_last > k0 && lo_first <= k_last) return true;
    }
  }
  return false;
}

template <class T, int kD>
__global__ void __launch_bounds__(kTcThreads) attention_grad_kv_tc(const __grid_constant__ Problem p, const float* ws) {
  constexpr int kTile = tc_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);                  // [64][kD + 8]
  T* sV = sK + kTile;                                  // [64][kD + 8]
  T* sQ[2] = {sV + kTile, sV + 3 * kTile};             // stage s: Q, then dO
  float* sL = reinterpret_cast<float*>(sV + 5 * kTile);  // [2][64] lse (log2 units)
  float* sR = sL + 2 * kTcRows;                        // [2][64] dO . O
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kTcKeys;
  const HeadView first = head_view(p, b, hk * p.group());
  if (!first.valid || k0 >= first.len_kv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int dims = int(p.head_dim);  // kD or less (padded: tc_head_dim)
  const int64_t k_last = min(k0 + kTcKeys, first.len_kv) - 1;
  issue_tile<kD>(sK, p.k.ptr<const T>(b, hk, first.tok_kv), p.k.seq, k0, first.len_kv, dims);
  issue_tile<kD>(sV, p.v.ptr<const T>(b, hk, first.tok_kv), p.v.seq, k0, first.len_kv, dims);

  // Stage s takes query tile (h, i0): Q and dO by cp.async, lse and dO . O by plain stores.
  auto load_stage = [&](int s, int64_t h, int64_t i0) {
    const HeadView v = head_view(p, b, h);
    issue_tile<kD>(sQ[s], p.q.ptr<const T>(b, h, v.tok_q), p.q.seq, i0, v.len_q, dims);
    issue_tile<kD>(sQ[s] + kTile, p.grad_out.ptr<const T>(b, h, v.tok_q), p.grad_out.seq, i0, v.len_q, dims);
    if (threadIdx.x < kTcRows) {
      const int64_t i = i0 + threadIdx.x;
      sL[s * kTcRows + threadIdx.x] = row_lse2(p, v, i);
      sR[s * kTcRows + threadIdx.x] = i < v.len_q ? ws[row_index(p, v, i)] : 0.f;
    }
  };
  int64_t h = hk * p.group(), i0 = 0;
  bool have = next_query_tile(p, b, hk, k0, k_last, h, i0);
  if (have) load_stage(0, h, i0);
  cp_async_commit();

  const WholeTileRule rule(p);
  const bool dropout = p.dropout_p > 0;
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};
  const int key_row = warp * 16 + lane % 16;  // this lane's ldmatrix row of the warp's 16 keys
  for (int stage = 0; have; stage ^= 1) {
    int64_t next_h = h, next_i0 = i0 + kTcRows;
    const bool next = next_query_tile(p, b, hk, k0, k_last, next_h, next_i0);
    if (next) load_stage(stage ^ 1, next_h, next_i0);  // streams in while this tile is used
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* tQ = sQ[stage];
    const T* tG = sQ[stage] + kTile;
    const float* tL = sL + stage * kTcRows;
    const float* tR = sR + stage * kTcRows;
    const HeadView v = head_view(p, b, h);

    const TileRule tile_rule = backward_rule(p, v, i0, min(i0 + kTcRows, v.len_q) - 1, k0);
    // The 64 query rows in two halves of 32 (S^T and dP^T of a whole tile
    // beside dK and dV would spill at kD = 128).
#pragma unroll 1
    for (int q0 = 0; q0 < kTcRows; q0 += 32) {
      // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x 32 query rows.
      float s[4][4] = {}, dp[4][4] = {};
      score_fragments<T, kD, 32>(s, dp, sK, sV, key_row, tQ, tG, q0, lane);
      // Element (nt, e): key k0 + warp * 16 + lane / 4 + 8 (e / 2), row i0 + q0 + nt * 8 + 2 quad + (e & 1).
      auto lse_rdot = [&](int nt, int e) {
        const int r = q0 + nt * 8 + 2 * quad + (e & 1);
        return make_float2(tL[r], tR[r]);
      };
      if (tile_rule != TileRule::full) {
        const uint32_t kept =
            dropout ? dropout_bits_keys<4>(p, v, i0 + q0 + 2 * quad, k0 + warp * 16 + lane / 4) : 0u;
        whole_tile_grads(tile_rule, dropout, s, dp, rule, lse_rdot, kept);
      } else {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = q0 + nt * 8 + 2 * quad + (e & 1);
            const int64_t j = k0 + warp * 16 + lane / 4 + 8 * (e / 2);
            const float2 g = grad_score_rule(p, v, s[nt][e], dp[nt][e], i0 + r, j, tL[r], tR[r]);
            dp[nt][e] = g.x, s[nt][e] = g.y;
          }
      }
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
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = k0 + warp * 16 + lane / 4 + 8 * r;
    if (j >= first.len_kv) continue;
    T* gk = p.grad_k.ptr<T>(b, hk, first.tok_kv + j);
    T* gv = p.grad_v.ptr<T>(b, hk, first.tok_kv + j);
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      const int d = dt * 8 + 2 * quad;
      if (d >= dims) break;  // a padded head dim (tc_head_dim)
      gk[d * p.grad_k.dim] = convert<T>(dk[dt][2 * r]);
      gk[(d + 1) * p.grad_k.dim] = convert<T>(dk[dt][2 * r + 1]);
      gv[d * p.grad_v.dim] = convert<T>(dv[dt][2 * r]);
      gv[(d + 1) * p.grad_v.dim] = convert<T>(dv[dt][2 * r + 1]);
    }
  }
}

template <class T, int kD>
__global__ void __launch_bounds__(kTcThreads) attention_grad_q_tc(const __grid_constant__ Problem p, const float* ws) {
  constexpr int kTile = tc_tile<kD>(), kDimTiles = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);                 // [64][kD + 8]
  T* sG = sQ + kTile;                                  // [64][kD + 8] dO
  T* sK[2] = {sG + kTile, sG + 3 * kTile};             // stage s: K, then V
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
    issue_tile<kD>(sK[0], k, p.k.seq, span_lo, v.len_kv, dims);
    issue_tile<kD>(sK[0] + kTile, val, p.v.seq, span_lo, v.len_kv, dims);
  }
  cp_async_commit();
  // Q and dO stay in shared memory (A fragments reread per tile): in
  // registers with dQ, S and dP they would spill at kD = 128.
  const int q_row = warp * 16 + lane % 16;  // this lane's ldmatrix row of the warp's 16 rows

  // This thread's rows: g and g + 8 of the warp's 16.
  int64_t row[2];
  float lse2[2], rdot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = row0 + warp * 16 + lane / 4 + 8 * r;
    lse2[r] = row_lse2(p, v, row[r]);
    rdot[r] = row[r] < v.len_q ? ws[row_index(p, v, row[r])] : 0.f;
  }
  const WholeTileRule rule(p);
  const bool dropout = p.dropout_p > 0;
  float dq[kDimTiles][4] = {};
  int stage = 0;
  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kTcKeys, stage ^= 1) {
    await_kv_stage<kD>(sK[stage ^ 1], k, p.k.seq, val, p.v.seq, k0 + kTcKeys, span_hi, v.len_kv, dims);
    const T* tK = sK[stage];
    const T* tV = sK[stage] + kTile;
    // S = Q K^T and dP = dO V^T: the warp's 16 rows x 64 keys.
    float s[8][4] = {}, dp[8][4] = {};
    score_fragments<T, kD, kTcKeys>(s, dp, sQ, sG, q_row, tK, tV, 0, lane);
    const TileRule tile_rule = backward_rule(p, v, row0, row_last, k0);
    auto lse_rdot = [&](int, int e) { return make_float2(lse2[e / 2], rdot[e / 2]); };
    if (tile_rule != TileRule::full) {
      const uint32_t kept = dropout ? uint32_t(dropout_keep_bits<8>(p, v, row, k0, quad)) : 0u;
      whole_tile_grads(tile_rule, dropout, s, dp, rule, lse_rdot, kept);
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dp[nt][e] = grad_score_rule(p, v, s[nt][e], dp[nt][e], row[e / 2], k0 + nt * 8 + 2 * quad + (e & 1),
                                      lse2[e / 2], rdot[e / 2]).x;
    }
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
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= v.len_q) continue;
    T* out = p.grad_q.ptr<T>(v.b, v.h, v.tok_q + row[r]);
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      const int d = dt * 8 + 2 * quad;
      if (d >= dims) break;  // a padded head dim (tc_head_dim)
      out[d * p.grad_q.dim] = convert<T>(dq[dt][2 * r]);
      out[(d + 1) * p.grad_q.dim] = convert<T>(dq[dt][2 * r + 1]);
    }
  }
}

template <class T, int kD>
Status launch(const Problem& p, const float* ws, CUstream_st* stream) {
  static_assert(kv_smem<kD>() == tc_backward_smem(kD) && q_smem<kD>() <= kv_smem<kD>(), "the plan checks this much");
  if (p.seq_q > 0) {
    constexpr size_t smem = q_smem<kD>();
    BARACUDA_TRY(allow_smem(attention_grad_q_tc<T, kD>, smem));
    const dim3 grid(unsigned((p.seq_q + kTcRows - 1) / kTcRows), unsigned(p.heads_q), unsigned(p.batch));
    attention_grad_q_tc<T, kD><<<grid, kTcThreads, smem, stream>>>(p, ws);
    BARACUDA_CUDA_TRY(cudaGetLastError());
  }
  if (p.seq_kv > 0) {
    constexpr size_t smem = kv_smem<kD>();
    BARACUDA_TRY(allow_smem(attention_grad_kv_tc<T, kD>, smem));
    const dim3 grid(unsigned((p.seq_kv + kTcKeys - 1) / kTcKeys), unsigned(p.heads_kv), unsigned(p.batch));
    attention_grad_kv_tc<T, kD><<<grid, kTcThreads, smem, stream>>>(p, ws);
    BARACUDA_CUDA_TRY(cudaGetLastError());
  }
  return Status::ok();
}

}  // namespace

template <class T>
Status attention_backward_tc(const Problem& p, const float* ws, CUstream_st* stream) {
  return tc_head_dim(p.head_dim) == 64 ? launch<T, 64>(p, ws, stream) : launch<T, 128>(p, ws, stream);
}
template Status attention_backward_tc<__half>(const Problem&, const float*, CUstream_st*);
template Status attention_backward_tc<__nv_bfloat16>(const Problem&, const float*, CUstream_st*);

}  // namespace baracuda::attn
