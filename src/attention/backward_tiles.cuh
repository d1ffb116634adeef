// Pieces the tensor-core attention backwards share (mma.sync:
// kernels_bwd_tc.cu; warpgroup MMA on Hopper: kernels_bwd_sm90.cu): the
// score rule's gradient on a thread's fragments, the walk over the query
// tiles a key tile meets, and the gradient write-out. Both kernels keep a
// warp's products in the same fragment layout (16 rows a warp; element
// (nt, e) at row lane / 4 + 8 (e / 2), column 8 nt + 2 (lane % 4) + (e % 2)).
#pragma once

#include "attention/tensor_core.cuh"

namespace baracuda::attn {

/// dS / scale of row i against key j from the raw products q.k and dO.v
/// under the whole score rule and dropout (x; Note [The scale at the end]),
/// and the probability times dropout's factor (y: the weight dV takes).
/// lse2: the row's lse in log2 units; rdot: its dO . O. Out of line: the
/// tiles that need it are the few on a mask, window or causal edge (or
/// every tile with ALiBi, softcap or dropout), and inlined into the unrolled
/// tile loop it would cost the plain tiles registers. By value in and out,
/// so that the callers' accumulators stay in registers; the head view too:
/// by reference it would live in local memory, stored there every query
/// tile of the callers' hot loops (the one-pass kernel's 96-byte stack
/// frame and its stalls on those stores).
inline __device__ __noinline__ float2 grad_score_rule(const Problem& p, const HeadView v, float raw, float dprob,
                                                      int64_t i, int64_t j, float lse2, float rdot) {
  float prob = 0, slope = 1;
  if (i < v.len_q) {
    int64_t lo, hi;
    key_range(p, i, v.len_q, v.len_kv, lo, hi);
    if (j >= lo && j < hi) {
      float capped;
      const float s = score<float>(p, v, raw, i, j, capped);
      prob = fast_exp2(s * kLog2e - lse2);
      slope = softcap_slope<float>(p, capped);
    }
  }
  if (prob == 0) return make_float2(0.f, 0.f);
  const float z = dropout_factor<float>(p, v, i, j);
  return make_float2(prob * (z * dprob - rdot) * slope, prob * z);
}

/// The constants of the scores on whole tiles (tile_whole): the forward's
/// (ScoreScales) and dropout's factor on a kept probability.
struct WholeTileRule : ScoreScales {
  float kept_scale;
  __device__ explicit WholeTileRule(const Problem& p)
      : ScoreScales(p), kept_scale(p.dropout_p > 0 ? dropout_scale<float>(p) : 1.f) {}
};

/// Whether a problem's backward kernels take the edges of its key ranges
/// inline (kEdges: TileRule bounds): a causal or window problem, whose edge
/// tiles are many. The others leave their few edge tiles (the last keys) to
/// the out-of-line rule: the inline test's registers cost their whole tiles
/// ~2% (H200, B4 H32 S4096 D128 one pass 389 -> 381 TFLOP/s).
__host__ __device__ inline bool inline_edges(const Problem& p) {
  return p.causal || p.window_left >= 0 || p.window_right >= 0;
}

/// A key tile's score code, by the forwards' rules (TileRule): inline
/// (grad_score_whole) on a problem with no mask or ALiBi, the scale alone or
/// with the softcap (plain, capped) on a whole tile and, with kEdges, with
/// each row's key-range test too on a causal or window edge or the last keys
/// (bounds, bounds_capped); else the whole rule element by element (full).
/// With dropout an inline tile also needs its keys from a multiple of 16
/// (whole dropout groups, Note [Attention dropout draws]).
template <bool kEdges>
__device__ __forceinline__ TileRule backward_rule(const Problem& p, const HeadView& v, int64_t row0, int64_t row_last,
                                                  int64_t k0) {
  if (p.mask.data || p.alibi_slopes || (p.dropout_p > 0 && (k0 & 15) != 0)) return TileRule::full;
  const bool whole = tile_whole(p, v, row0, row_last, k0, kTcKeys);
  return whole || kEdges ? inline_rule(p, whole) : TileRule::full;
}

/// Dropout keep bits of a dK/dV-pass fragment (bit 4 nt + e: row r + 8 nt +
/// (e % 2), key key + 8 (e / 2)). The lanes of keys key and key ^ 1 (lane ^ 4,
/// the same rows) need the same two groups of tiles nt, nt + 1 (nt even), of
/// rows of parity 0 and 1, half of each: a lane makes the call of the rows of
/// its key's parity and hands the other lane the halves its key takes, so one
/// Philox call covers 8 scores, as in the forward. The whole warp calls this
/// together; r % 16 < 7 and key % 16 < 8 (bit 3 clear in the row and key).
template <int kN>
__device__ __forceinline__ uint32_t dropout_bits_keys(const Problem& p, const HeadView& v, int64_t r, int64_t key) {
  static_assert(kN % 2 == 0 && kN * 4 <= 32, "whole groups, one bit a score");
  const uint32_t threshold = dropout_threshold(p.dropout_p);
  const int own = int(key & 1);  // the row parity this lane draws for; its key takes the high halves when odd
  // __byte_perm selectors packing the low (0x5410) or high (0x7632) halves of two words as lo | hi << 16.
  const uint32_t keep = own ? 0x7632u : 0x5410u, give = own ? 0x5410u : 0x7632u;
  uint32_t bits = 0;
#pragma unroll
  for (int nt = 0; nt < kN; nt += 2) {
    const PhiloxWords w = dropout_draws(p, v.b, v.h, r + nt * 8 + own, key);
#pragma unroll
    for (int d = 0; d < 2; ++d) {  // row + 8 d: words 2 d (key) and 2 d + 1 (key + 8)
      const uint32_t mine = __byte_perm(w.v[2 * d], w.v[2 * d + 1], keep);
      const uint32_t other = __shfl_xor_sync(0xffffffffu, __byte_perm(w.v[2 * d], w.v[2 * d + 1], give), 4);
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) {
        const int bit = 4 * (nt + d) + 2 * kh;
        bits |= uint32_t(((mine >> (16 * kh)) & 0xffffu) >= threshold) << (bit + own);
        bits |= uint32_t(((other >> (16 * kh)) & 0xffffu) >= threshold) << (bit + (own ^ 1));
      }
    }
  }
  return bits;
}

/// dS / scale (x) and P times dropout's factor z (y) on a whole tile
/// (tile_whole): the scale alone, or with kCapped the softcap too (score =
/// cap tanh(scale raw / cap), d score / d raw = scale (1 - tanh^2)), inline
/// where grad_score_rule would pay a call and the key-range test per
/// element. dS = P (z dP - dO.O) d score / d raw.
///
/// Note [The scale at the end]
/// Every dS of the tensor-core backwards leaves out the scale, a factor of
/// d score / d raw common to all of them: dK = scale sum dS^T Q and dQ =
/// scale sum dS K take it once, as their f32 sums are written
/// (write_key_grads, write_query_grads, the one pass's last dQ pass), not
/// once a score (32 multiplies a thread and tile), as FlashAttention-2
/// does. A dS stored as f16 (for dQ's product) is then 1 / scale larger
/// than the scaled one: the same range FlashAttention-2 gives it.
template <bool kCapped>
__device__ __forceinline__ float2 grad_score_whole(float raw, float dprob, const WholeTileRule& w, float lse2,
                                                   float rdot, float z) {
  if constexpr (kCapped) {
    const float t = fast_tanh(raw * w.scale_over_cap);  // as the forward (tile_scores)
    const float prob = fast_exp2(t * w.cap_log2 - lse2);
    return make_float2(prob * (z * dprob - rdot) * (1.f - t * t), prob * z);
  } else {
    const float prob = fast_exp2(raw * w.scale_log2 - lse2);
    return make_float2(prob * (z * dprob - rdot), prob * z);
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

/// whole_tile_grads specialised on the softcap (`rule` capped or plain, or
/// their bounds forms) and dropout; `kept` is read only with dropout. The
/// bounds forms then zero both results of each element whose key is out of
/// its row's range (visible(nt, e) false): selects, so that the inf or NaN
/// the scale-only code may give there goes too.
template <int kN, class RowOf, class Visible>
__device__ __forceinline__ void whole_tile_grads(TileRule rule, bool dropout, float (&s)[kN][4], float (&dp)[kN][4],
                                                 const WholeTileRule& w, RowOf&& lse_rdot, uint32_t kept,
                                                 Visible&& visible) {
  if (rule == TileRule::capped || rule == TileRule::bounds_capped) {
    if (dropout) whole_tile_grads<true, true>(s, dp, w, lse_rdot, kept);
    else whole_tile_grads<true, false>(s, dp, w, lse_rdot, kept);
  } else {
    if (dropout) whole_tile_grads<false, true>(s, dp, w, lse_rdot, kept);
    else whole_tile_grads<false, false>(s, dp, w, lse_rdot, kept);
  }
  if (rule == TileRule::bounds || rule == TileRule::bounds_capped) {
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool seen = visible(nt, e);
        dp[nt][e] = seen ? dp[nt][e] : 0.f, s[nt][e] = seen ? s[nt][e] : 0.f;
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

/// The next query tile (head h, rows from i0) of a key head's group (query
/// heads up to h_end: the caller's, once a block, a 64-bit division that
/// ptxas otherwise left in the walk, a tile at a time) that sees a key of
/// [k0, k_last], from (h, i0) on; false when none is left. `lengths`: a head
/// view of the batch (every head of a batch has its lengths).
/// The three dK/dV kernels write their double-buffered walk over these tiles
/// out in full: a shared walk taking the tile's work as a lambda made ptxas
/// spill (sm_90a, the two-pass wgmma kernel at head dim 128: 36 -> 196 bytes
/// of spill stores; the one-pass kernel's stack 96 -> 128 bytes).
inline __device__ bool next_query_tile(const Problem& p, const HeadView& lengths, int64_t h_end, int64_t k0,
                                       int64_t k_last, int64_t& h, int64_t& i0) {
  const int64_t len_q = lengths.len_q, len_kv = lengths.len_kv;
  for (; h < h_end; ++h, i0 = 0) {
    for (; i0 < len_q; i0 += kTcRows) {
      if (!inline_edges(p)) return true;  // every row sees every key: no key ranges to work out, a tile at a time
      int64_t lo_first, hi_first, lo_last, hi_last;
      key_range(p, i0, len_q, len_kv, lo_first, hi_first);
      key_range(p, min(i0 + kTcRows, len_q) - 1, len_q, len_kv, lo_last, hi_last);
      if (hi_last > k0 && lo_first <= k_last) return true;
    }
  }
  return false;
}

/// The view of query head h of the key-head group whose view is `group`
/// (same batch and key head): no division, the ALiBi slope read only where
/// there is one.
__device__ __forceinline__ HeadView group_head_view(const Problem& p, const HeadView& group, int64_t h) {
  if (p.alibi_slopes) return head_view(p, group.b, h);
  HeadView v = group;
  v.h = h;
  return v;
}

/// Issues the copies of the statistics (RowStats) of query rows [i0, i0 +
/// 64) of head h (`lengths`: a head view of its batch) into sS, planar (64
/// lse in log2 units, then 64 dO . O: interleaved, the tile's 16-byte loads
/// of two rows made ptxas spill in the one pass), by 4-byte cp.async in the
/// caller's commit group: no thread waits on a load here. Rows past the
/// sequence get lse2 +inf and dO . O 0: no weight.
inline __device__ void stage_row_stats(float* sS, const Problem& p, const HeadView& lengths, int64_t h, int64_t i0,
                                       const RowStats* ws) {
  const int t = threadIdx.x;
  if (t >= kTcRows) return;
  const int64_t i = i0 + t;
  if (i < lengths.len_q) {
    const RowStats* row = ws + (lengths.b * p.heads_q + h) * p.seq_q + i;  // row_index
    cp_async_4(sS + t, &row->x);
    cp_async_4(sS + kTcRows + t, &row->y);
  } else {
    sS[t] = INFINITY, sS[kTcRows + t] = 0.f;
  }
}

/// The dK/dV pass's fragments (keys as rows: element (nt, e) is key `key` +
/// 8 (e / 2) against query row i0 + c0 + 8 nt + 2 quad + (e % 2); tL and tR
/// the tile's rows' statistics, stage_row_stats'): dp becomes dS^T and s
/// P^T times dropout's factor, by `rule` (backward_rule<kEdges>).
template <bool kEdges, int kN>
__device__ __forceinline__ void key_fragment_grads(float (&s)[kN][4], float (&dp)[kN][4], const Problem& p,
                                                   const HeadView& v, TileRule rule, const WholeTileRule& w,
                                                   const float* tS, int64_t i0, int c0, int64_t key, int quad) {
  if (rule != TileRule::full) {
    auto lse_rdot = [&](int nt, int e) {
      const int r = c0 + nt * 8 + 2 * quad + (e & 1);
      return make_float2(tS[r], tS[kTcRows + r]);
    };
    auto visible = [&, r0 = i0 + c0 + 2 * quad](int nt, int e) {  // row r0 + 8 nt + e % 2, key key + 8 (e / 2)
      if constexpr (!kEdges) return true;
      const int di = 8 * nt + (e & 1), dj = 8 * (e / 2);
      const KeyOffsets range(p, v.len_q, v.len_kv);
      return di < v.len_q - r0 && dj < v.len_kv - key && range.holds(key - r0 - range.shift + dj - di);
    };
    const bool dropout = p.dropout_p > 0;
    const uint32_t kept = dropout ? dropout_bits_keys<kN>(p, v, i0 + c0 + 2 * quad, key) : 0u;
    whole_tile_grads(rule, dropout, s, dp, w, lse_rdot, kept, visible);
    return;
  }
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = c0 + nt * 8 + 2 * quad + (e & 1);
      const float2 g = grad_score_rule(p, v, s[nt][e], dp[nt][e], i0 + r, key + 8 * (e / 2), tS[r], tS[kTcRows + r]);
      dp[nt][e] = g.x, s[nt][e] = g.y;
    }
}

/// A dQ-pass thread's two query rows (row0 + lane / 4 + 8 r of its warp's
/// 16 from `row0`), their lse in log2 units and dO . O (RowStats).
struct GradRows {
  int64_t row[2];
  float lse2[2], rdot[2];
  __device__ GradRows(const Problem& p, const HeadView& v, int64_t row0, const RowStats* ws) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r] = row0 + threadIdx.x % 32 / 4 + 8 * r;
      const RowStats stats = row[r] < v.len_q ? ws[row_index(p, v, row[r])] : make_float2(INFINITY, 0.f);
      lse2[r] = stats.x, rdot[r] = stats.y;
    }
  }
};

/// The dQ pass's fragments (query rows as rows: element (nt, e) is row
/// rows.row[e / 2] against key k0 + 8 nt + 2 quad + (e % 2)): dp becomes dS,
/// by `rule` (backward_rule<kEdges>).
template <bool kEdges, int kN>
__device__ __forceinline__ void row_fragment_grads(float (&s)[kN][4], float (&dp)[kN][4], const Problem& p,
                                                   const HeadView& v, TileRule rule, const WholeTileRule& w,
                                                   const GradRows& rows, int64_t k0, int quad) {
  if (rule != TileRule::full) {
    auto lse_rdot = [&](int, int e) { return make_float2(rows.lse2[e / 2], rows.rdot[e / 2]); };
    auto visible = [&](int nt, int e) {  // row rows.row[e / 2], key k0 + 8 nt + 2 quad + e % 2
      if constexpr (!kEdges) return true;
      const int64_t i = rows.row[e / 2], j = k0 + nt * 8 + 2 * quad + (e & 1);
      const KeyOffsets range(p, v.len_q, v.len_kv);
      return i < v.len_q && j < v.len_kv && range.holds(j - i - range.shift);
    };
    const bool dropout = p.dropout_p > 0;
    const uint32_t kept = dropout ? uint32_t(dropout_keep_bits<kN>(p, v, rows.row, k0, quad)) : 0u;
    whole_tile_grads(rule, dropout, s, dp, w, lse_rdot, kept, visible);
    return;
  }
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dp[nt][e] = grad_score_rule(p, v, s[nt][e], dp[nt][e], rows.row[e / 2], k0 + nt * 8 + 2 * quad + (e & 1),
                                  rows.lse2[e / 2], rows.rdot[e / 2]).x;
}

/// Stores an accumulator's two neighbouring dims (d, d + 1) of one row:
/// one 4-byte store where the head dim is contiguous and the row starts
/// 4-byte aligned (d is even), else two. Two-byte stores with 64-bit
/// address arithmetic each were 6.5% of the one-pass backward's stall
/// samples (ncu, B1 H32 S4096 D128), all in its last lines.
template <class T>
__device__ __forceinline__ void store_dim_pair(T* row, int64_t dim_stride, bool paired, int d, float a, float b) {
  if (paired) {
    *reinterpret_cast<uint32_t*>(row + d) = pack2<T>(a, b);
  } else {
    row[d * dim_stride] = convert<T>(a);
    row[(d + 1) * dim_stride] = convert<T>(b);
  }
}
/// Whether every row of an operand takes store_dim_pair's 4-byte stores.
__device__ __forceinline__ bool pairs_fit(const Operand& o) {
  return o.dim == 1 && ((reinterpret_cast<uintptr_t>(o.data) % 4) | ((o.batch | o.head | o.seq) & 1)) == 0;
}

/// Writes a warp's dK and dV fragments (keys `key` and key + 8 of key head
/// hk, dims 8 dt + 2 quad and the next, those below `dims`: a padded head
/// dim, tc_head_dim, writes only its own).
template <class T, int kDimTiles>
__device__ __forceinline__ void write_key_grads(const Problem& p, const HeadView& first, int64_t b, int64_t hk,
                                                int64_t key, const float (&dk)[kDimTiles][4],
                                                const float (&dv)[kDimTiles][4], int quad, int dims) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = key + 8 * r;
    if (j >= first.len_kv) continue;
    T* gk = p.grad_k.ptr<T>(b, hk, first.tok_kv + j);
    T* gv = p.grad_v.ptr<T>(b, hk, first.tok_kv + j);
    const bool k_pairs = pairs_fit(p.grad_k), v_pairs = pairs_fit(p.grad_v);
    const float scale = float(p.scale);  // Note [The scale at the end]
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      const int d = dt * 8 + 2 * quad;
      if (d >= dims) break;
      store_dim_pair(gk, p.grad_k.dim, k_pairs, d, dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
      store_dim_pair(gv, p.grad_v.dim, v_pairs, d, dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

/// Writes a warp's dQ fragments (rows row[0], row[1] of head view v; dims as write_key_grads).
template <class T, int kDimTiles>
__device__ __forceinline__ void write_query_grads(const Problem& p, const HeadView& v, const int64_t (&row)[2],
                                                  const float (&dq)[kDimTiles][4], int quad, int dims) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= v.len_q) continue;
    T* out = p.grad_q.ptr<T>(v.b, v.h, v.tok_q + row[r]);
    const bool pairs = pairs_fit(p.grad_q);
    const float scale = float(p.scale);  // Note [The scale at the end]
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      const int d = dt * 8 + 2 * quad;
      if (d >= dims) break;
      store_dim_pair(out, p.grad_q.dim, pairs, d, dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
  }
}

/// Launches one backward pass: ceil(seq / tile) x heads x batch blocks (none
/// when the sequence is empty), the kernel taking the problem, then `args`.
/// The dQ passes run over (query tiles, query heads), the dK/dV passes over
/// (key tiles, key heads).
template <class Kernel, class... Args>
Status launch_pass(Kernel kernel, size_t smem, int threads, int64_t seq, int tile, int64_t heads, const Problem& p,
                   CUstream_st* stream, const Args&... args) {
  if (seq == 0) return Status::ok();
  BARACUDA_TRY(allow_smem(kernel, smem));
  const dim3 grid(unsigned((seq + tile - 1) / tile), unsigned(heads), unsigned(p.batch));
  kernel<<<grid, threads, smem, stream>>>(p, args...);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::attn
