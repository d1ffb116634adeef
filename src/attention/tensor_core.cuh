// Pieces the tensor-core flash kernels (forward, dQ and dK/dV) share: the
// tile shape, 16-byte tile copies into padded shared memory, the test for a
// tile no score rule touches, and the layouts they accept.
#pragma once

#include "attention/kernels.cuh"

namespace baracuda::attn {

constexpr int kTcWarps = 4, kTcThreads = kTcWarps * 32, kTcRows = 16 * kTcWarps, kTcKeys = 64;
static_assert(kTcRows == 64 && kTcKeys == 64, "the tile copies and tc_backward_smem count 64 rows, query or key");
constexpr float kLog2e = 1.4426950408889634f;

/// Elements of one padded 64-row tile (pitch kD + 8: ldmatrix rows fall in distinct banks).
template <int kD>
constexpr int tc_tile() {
  return kTcKeys * (kD + 8);
}

/// Issues the copy of 64 rows of kD elements (unit dim stride, 16-byte rows)
/// into a tile with a pitch of kD + 8; rows at or past `len` and columns at
/// or past `dims` (a padded head dim: tc_head_dim) are zero-filled.
template <int kD, class T>
__device__ __forceinline__ void issue_tile(T* s, const T* base, int64_t seq, int64_t row0, int64_t len, int dims) {
  constexpr int kPerRow = kD / 8;
  for (int e = threadIdx.x; e < 64 * kPerRow; e += kTcThreads) {
    const int r = e / kPerRow, c = e % kPerRow;
    const int64_t i = row0 + r;
    const bool inside = i < len && c * 8 < dims;
    cp_async_16(s + r * (kD + 8) + c * 8, inside ? base + i * seq + c * 8 : base, inside);
  }
}

/// One step of the K/V double buffer: issues the copy of the key and value
/// rows from `next` into `dst` (K, then V one tile further) when `next` is
/// before `end`, then waits for the stage issued one step earlier, so that the
/// next tile streams in while this one is used. Every thread calls it.
template <int kD, class T>
__device__ __forceinline__ void await_kv_stage(T* dst, const T* k, int64_t k_seq, const T* v, int64_t v_seq,
                                               int64_t next, int64_t end, int64_t len_kv, int dims) {
  if (next < end) {
    issue_tile<kD>(dst, k, k_seq, next, len_kv, dims);
    issue_tile<kD>(dst + tc_tile<kD>(), v, v_seq, next, len_kv, dims);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
}

/// Whether every key of the tile is inside every row's range and there is no
/// mask or ALiBi: its scores need at most the scale and the softcap.
__device__ __forceinline__ bool tile_whole(const Problem& p, const HeadView& v, int64_t row0, int64_t row_last,
                                           int64_t k0, int keys) {
  if (p.mask.data || p.alibi_slopes || k0 + keys > v.len_kv) return false;
  int64_t lo_first, hi_first, lo_last, hi_last;
  key_range(p, row0, v.len_q, v.len_kv, lo_first, hi_first);
  key_range(p, row_last, v.len_q, v.len_kv, lo_last, hi_last);
  return k0 >= lo_last && k0 + keys <= hi_first;
}

// ---------------------------------------------------------------- forward steps
// The tensor-core forwards (mma.sync in kernels_fwd.cu, wgmma in
// kernels_fwd_sm90.cu) share the accumulator layout of a thread: s[n][e] is
// row row[e / 2] (g and g + 8 of its warp's 16) and key k0 + 8 n + 2 quad +
// (e % 2); o[n][e] the same rows and dim 8 n + 2 quad + (e % 2). Scores are
// kept in log2 units (times log2 e) so each exponential is one ex2.

/// The rows of one thread's fragments and the key range of each.
struct FragRows {
  int64_t row[2], lo[2], hi[2];
  __device__ FragRows(const Problem& p, const HeadView& v, int64_t first) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r] = first + 8 * r;
      lo[r] = hi[r] = 0;
      if (row[r] < v.len_q) key_range(p, row[r], v.len_q, v.len_kv, lo[r], hi[r]);
    }
  }
};

/// How a key tile's raw products become scores: `plain`, the scale alone
/// (tile_whole, no softcap); `bounds`, the scale and -inf outside each row's key range
/// (the causal and window edges of a problem with no mask, ALiBi or
/// softcap); `capped` and `bounds_capped`, the same with the softcap inline
/// (a softcap problem with no mask or ALiBi); `full`, the whole score rule
/// element by element.
enum class TileRule { plain, bounds, capped, bounds_capped, full };

/// The factors a tile's scores take, once per kernel: raw products to log2
/// units, and with a softcap raw / cap and cap in log2 units.
struct ScoreScales {
  float scale_log2, scale_over_cap, cap_log2;
  __device__ explicit ScoreScales(const Problem& p)
      : scale_log2(float(p.scale * 1.4426950408889634)),
        scale_over_cap(p.softcap > 0 ? float(p.scale / p.softcap) : 0.f),
        cap_log2(float(p.softcap * 1.4426950408889634)) {}
};

/// p.softcap > 0 (the plan takes softcaps >= 0, no NaN) as an integer
/// compare of the double's bits: a tile's double compare waited on the
/// FP64 pipe behind the wgmmas (ncu: 4% of the one-pass backward's stall
/// samples, at that one instruction, "math pipe throttle").
__device__ __forceinline__ bool has_softcap(const Problem& p) { return __double_as_longlong(p.softcap) > 0; }

/// The rule of a tile of a problem with no mask or ALiBi: whole (every key in
/// every row's range) or on an edge, with or without the softcap.
__device__ __forceinline__ TileRule inline_rule(const Problem& p, bool whole) {
  if (has_softcap(p)) return whole ? TileRule::capped : TileRule::bounds_capped;
  return whole ? TileRule::plain : TileRule::bounds;
}

/// Whether tile_scores can leave a rule's scores as raw products and scale
/// only the maxima (the scale alone and the key-range test: the plan takes
/// scales > 0 only, which keep the order; -inf stays -inf).
constexpr bool scale_deferrable(TileRule rule) { return rule == TileRule::plain || rule == TileRule::bounds; }

/// Turns the raw products q.k of a key tile into scores in log2 units by
/// `kRule`; the row maxima of the tile into `tile_max` (over the 4 lanes of a
/// row). With kDeferScale (a scale_deferrable rule) the scores stay raw
/// products and only the maxima are scaled: softmax_rows then takes the
/// scale into its exponent's fused multiply-add. Four partial maxima a row
/// keep the chains short.
template <TileRule kRule, bool kDeferScale = false, int kN>
__device__ __forceinline__ void tile_scores(float (&s)[kN][4], float (&tile_max)[2], const Problem& p,
                                            const HeadView& v, const FragRows& f, int64_t k0, int quad,
                                            const ScoreScales& sc) {
  constexpr bool kCapped = kRule == TileRule::capped || kRule == TileRule::bounds_capped;
  constexpr bool kBounds = kRule == TileRule::bounds || kRule == TileRule::bounds_capped || kRule == TileRule::full;
  static_assert(!kDeferScale || scale_deferrable(kRule), "only the scale and the key-range test defer the scale");
  constexpr bool kDefer = kDeferScale;
  constexpr int kChains = kN >= 4 ? 4 : kN;
  float part[2][kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) part[0][c] = part[1][c] = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      float x = kDefer    ? s[nt][e]
                : kCapped ? fast_tanh(s[nt][e] * sc.scale_over_cap) * sc.cap_log2
                          : s[nt][e] * sc.scale_log2;
      if constexpr (kBounds) {
        const int64_t j = k0 + nt * 8 + 2 * quad + (e & 1);
        float capped;
        if (j < f.lo[r] || j >= f.hi[r]) x = -INFINITY;
        else if constexpr (kRule == TileRule::full) x = score<float>(p, v, s[nt][e], f.row[r], j, capped) * kLog2e;
      }
      s[nt][e] = x;
      part[r][nt % kChains] = fmaxf(part[r][nt % kChains], x);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int c = 1; c < kChains; ++c) part[r][0] = fmaxf(part[r][0], part[r][c]);
    tile_max[r] = fmaxf(part[r][0], __shfl_xor_sync(0xffffffffu, part[r][0], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    if constexpr (kDefer) tile_max[r] *= sc.scale_log2;
  }
}

/// tile_scores by a rule known only at run time.
template <int kN>
__device__ __forceinline__ void tile_scores(float (&s)[kN][4], float (&tile_max)[2], const Problem& p,
                                            const HeadView& v, const FragRows& f, int64_t k0, int quad, TileRule rule,
                                            const ScoreScales& sc) {
  switch (rule) {
    case TileRule::plain: return tile_scores<TileRule::plain>(s, tile_max, p, v, f, k0, quad, sc);
    case TileRule::capped: return tile_scores<TileRule::capped>(s, tile_max, p, v, f, k0, quad, sc);
    default: return tile_scores<TileRule::full>(s, tile_max, p, v, f, k0, quad, sc);
  }
}

/// Dropout's keep bits for a thread's scores of a key tile (rows rows[e /
/// 2], keys k0 + 8 nt + 2 quad + (e % 2): bit 4 nt + e; the layout of the
/// forwards and the backward's dQ pass), drawn by groups
/// (one Philox call per 8 scores, Note [Attention dropout draws]) where the
/// tile starts on the 16-key grid (and rows[0] has bit 3 clear, rows[1] =
/// rows[0] + 8), else a score at a time (a window's span may start anywhere). The loops stay rolled, two groups at a time: unrolled,
/// the Philox calls of a 128-key tile interleave and spill beside the Hopper
/// forward's accumulators (0.5-2 KiB, ptxas sm_90a). The draws depend on the
/// positions alone, so a kernel may take them before its scores are ready.
template <int kN>
__device__ __forceinline__ uint64_t dropout_keep_bits(const Problem& p, const HeadView& v, const int64_t (&rows)[2],
                                                      int64_t k0, int quad) {
  static_assert(kN % 2 == 0 && kN <= 16, "a keep bit a score in 64 bits");
  uint64_t kept = 0;
  if ((k0 & 15) == 0 && (rows[0] & 15) < 8) {
    const uint32_t threshold = dropout_threshold(p.dropout_p);
#pragma unroll 2
    for (int g = 0; g < kN / 2; ++g) {
      const PhiloxWords w = dropout_draws(p, v.b, v.h, rows[0], k0 + g * 16 + 2 * quad);
      uint32_t bits = 0;
#pragma unroll
      for (int d = 0; d < 2; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) bits |= uint32_t(group_draw(w, e / 2, d, e & 1) >= threshold) << (4 * d + e);
      kept |= uint64_t(bits) << (8 * g);
    }
  } else {
#pragma unroll 1
    for (int bit = 0; bit < 4 * kN; ++bit) {
      const int64_t row = bit & 2 ? rows[1] : rows[0], key = k0 + bit / 4 * 8 + 2 * quad + (bit & 1);
      kept |= uint64_t(dropout_keep(p, v.b, v.h, row, key)) << bit;
    }
  }
  return kept;
}

/// Dropout's factor on a thread's probabilities by their keep bits
/// (dropout_keep_bits): `scale` where kept, 0 where dropped.
template <int kN>
__device__ __forceinline__ void apply_keep_bits(float (&s)[kN][4], uint64_t kept, float scale) {
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= (kept >> (4 * nt + e)) & 1 ? scale : 0.f;
}

/// Dropout on a thread's probabilities s[nt][e] of the key tile at k0.
template <int kN>
__device__ __forceinline__ void apply_dropout(float (&s)[kN][4], const Problem& p, const HeadView& v,
                                              const FragRows& f, int64_t k0, int quad) {
  apply_keep_bits(s, dropout_keep_bits<kN>(p, v, f.row, k0, quad), dropout_scale<float>(p));
}

/// One online-softmax step over a key tile of scores (log2 units; raw
/// products times `scale` where tile_scores deferred the scale) with row
/// maxima `tile_max`, all but the rescaling of the output: updates the
/// running max `m` and sum `l`, leaves in `corr` the factor the output
/// accumulators take (rescale_rows) and in `s` the probabilities times
/// dropout's factor (the sum counts them before dropout; four partial sums a
/// row, in a fixed order). kDropout false leaves dropout out, for kernels
/// launched only without it (the Hopper forward's plain instances), which
/// its code would cost registers.
template <bool kDropout = true, int kN>
__device__ __forceinline__ void softmax_rows(float (&s)[kN][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             const float (&tile_max)[2], const Problem& p, const HeadView& v,
                                             const FragRows& f, int64_t k0, int quad, float scale = 1.f) {
  constexpr int kChains = kN >= 4 ? 4 : kN;
  float m_new[2], m_ref[2], part[2][kChains];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m_new[r] = fmaxf(m[r], tile_max[r]);
    corr[r] = m_new[r] == -INFINITY ? 1.f : fast_exp2(m[r] - m_new[r]);
    m_ref[r] = m_new[r] == -INFINITY ? 0.f : m_new[r];  // all -inf so far: exp2(-inf - 0) = 0, no NaN
#pragma unroll
    for (int c = 0; c < kChains; ++c) part[r][c] = 0.f;
  }
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pr = fast_exp2(fmaf(s[nt][e], scale, -m_ref[e / 2]));
      part[e / 2][nt % kChains] += pr;
      s[nt][e] = pr;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = part[r][0];
#pragma unroll
    for (int c = 1; c < kChains; ++c) sum += part[r][c];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l[r] = l[r] * corr[r] + sum;
    m[r] = m_new[r];
  }
  if constexpr (kDropout)
    if (p.dropout_p > 0) apply_dropout(s, p, v, f, k0, quad);
}

/// Rescales a thread's output accumulators by softmax_rows' factors.
template <int kDimTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kDimTiles][4], const float (&corr)[2]) {
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] *= corr[0], o[dt][1] *= corr[0], o[dt][2] *= corr[1], o[dt][3] *= corr[1];
}

/// One whole online-softmax step (softmax_rows, then rescale_rows).
template <int kN, int kDimTiles>
__device__ __forceinline__ void online_softmax(float (&s)[kN][4], float (&o)[kDimTiles][4], float (&m)[2],
                                               float (&l)[2], const float (&tile_max)[2], const Problem& p,
                                               const HeadView& v, const FragRows& f, int64_t k0, int quad) {
  float corr[2];
  softmax_rows(s, m, l, corr, tile_max, p, v, f, k0, quad);
  rescale_rows(o, corr);
}

/// Writes a thread's rows of out (o / l) and lse (row_lse).
template <class T, int kDimTiles>
__device__ __forceinline__ void write_rows(const Problem& p, const HeadView& v, const FragRows& f,
                                           const float (&o)[kDimTiles][4], const float (&m)[2], const float (&l)[2],
                                           int quad) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (f.row[r] >= v.len_q) continue;
    const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
    T* out = reinterpret_cast<T*>(p.out.data) + p.out.at(v.b, v.h, v.tok_q + f.row[r]);
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      const int d = dt * 8 + 2 * quad;
      if (d >= p.value_dim) break;  // a padded head dim (tc_head_dim)
      out[d * p.out.dim] = convert<T>(o[dt][2 * r] * inv);
      out[(d + 1) * p.out.dim] = convert<T>(o[dt][2 * r + 1] * inv);
    }
    if (quad == 0) reinterpret_cast<float*>(p.lse.data)[p.lse.at(v.b, v.h, v.tok_q + f.row[r])] = row_lse(m[r], l[r]);
  }
}

/// The forward on Hopper's warpgroup MMA (kernels_fwd_sm90.cu) for a problem
/// wgmma_layout takes.
template <class T>
Status attention_forward_wgmma(const Problem& p, CUstream_st* stream);

/// A query row's statistics for the tensor-core backwards, written by the
/// dO . O pass (row_index order): x its lse in log2 units (+inf for a row
/// that saw no key, so that exp2(score - x) is 0), y its dO . O: converted
/// once a row here instead of once a tile in every key block.
using RowStats = float2;

/// The backward on tensor cores (kernels_bwd_tc.cu) for a problem
/// tensor_core_layout takes, after the per-row statistics in `ws`.
template <class T>
Status attention_backward_tc(const Problem& p, const RowStats* ws, CUstream_st* stream);

/// The backward on Hopper's warpgroup MMA (kernels_bwd_sm90.cu) for a
/// problem wgmma_backward_layout takes, after the per-row statistics in `ws`.
template <class T>
Status attention_backward_wgmma(const Problem& p, const RowStats* ws, CUstream_st* stream);

}  // namespace baracuda::attn
