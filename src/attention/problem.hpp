// Attention family: the one problem scaled dot-product attention binds to
// (dense [B, H, S, D] views or packed variable-length sequences), forward
// and backward, and the score rules (mask, window, ALiBi, softcap, dropout)
// shared by the host reference and the CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "baracuda/core.hpp"
#include "core/dtype_traits.hpp"
#include "core/launch_table.hpp"
#include "core/philox.hpp"

struct CUstream_st;

namespace baracuda::attn {

/// Element strides of a [batch, head, seq, dim] operand. Packed
/// variable-length operands ([tokens, head, dim]) have batch = 0 and their
/// token index is the sequence's start offset plus the position.
struct Operand {
  char* data = nullptr;
  int64_t batch = 0, head = 0, seq = 0, dim = 0;
  BCD_HD int64_t at(int64_t b, int64_t h, int64_t s) const { return b * batch + h * head + s * seq; }
  /// Element (b, h, s, 0) as a T* (T const for an input).
  template <class T>
  BCD_HD T* ptr(int64_t b, int64_t h, int64_t s) const {
    return reinterpret_cast<T*>(data) + at(b, h, s);
  }
};

/// out[b, h, i] = sum_j softmax_j(score(b, h, i, j)) * dropout(b, h, i, j) * v[b, h / group, j]
/// score = scale * q[b, h, i] . k[b, h / group, j], then softcap, then ALiBi
/// and the additive mask; keys the causal rule, the window or a false boolean
/// mask hide get -inf. lse[b, h, i] = log sum_j exp(score) (natural log, f32;
/// f64 for f64). A query that sees no key gets out = 0 and lse = -inf.
struct Problem {
  DType dtype = DType::bf16;  ///< q, k, v, out (and every gradient)
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0, value_dim = 0;
  /// Packed sequences: batch + 1 non-decreasing token offsets (int32, memory
  /// of the backend that runs); seq_q and seq_kv are then the longest lengths.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  int64_t tokens_q = 0, tokens_kv = 0;  ///< packed: rows of q and k (offsets past them are invalid)
  /// cuDNN engine only, dense operands: a padding mask over per-sequence
  /// lengths. Sequence b has padded_len_q[b] queries and padded_len_kv[b]
  /// keys (int32 [batch] in device memory, each within seq_q / seq_kv; bound
  /// per run); keys past its length weigh nothing, and its query rows past
  /// its length are neither computed nor written (the caller gives them
  /// their result). Decode runs on it.
  bool padded = false;
  const int32_t* padded_len_q = nullptr;
  const int32_t* padded_len_kv = nullptr;

  Operand q, k, v, out;
  Operand lse;  ///< f32 (f64 for f64 problems), dim unused

  Operand mask;  ///< over [b, h, i, j] (j on `dim`), stride 0 broadcasts; data null: none
  DType mask_dtype = DType::boolean;  ///< bool: false hides the key; a float dtype: added to the score
  const void* alibi_slopes = nullptr;  ///< f32 (f64 for f64 problems), per (b, query head) or per query head
  int64_t alibi_batch_stride = 0, alibi_head_stride = 1;

  double scale = 1, softcap = 0;  ///< softcap > 0: score = softcap * tanh(score / softcap)
  bool causal = false;
  bool bottom_right = false;  ///< the diagonal meets the last key (query i sits at i + Lk - Lq)
  int64_t window_left = -1, window_right = -1;  ///< -1: unbounded
  float dropout_p = 0;
  uint64_t seed = 0, offset = 0;

  // Backward only: grad_out and out (dim of value_dim), lse as forward.
  bool backward = false;
  Operand grad_out, grad_q, grad_k, grad_v;
  /// Backward: the run must be bitwise reproducible. When false, the Hopper
  /// backward may sum dQ by f32 reductions in one pass (Note [One-pass Hopper backward]).
  bool deterministic = true;
  /// Set by that backward's launcher: its f32 dQ sums in the workspace
  /// (layout: tiles::kDqPitch, grad_q_sum_index); null when it runs two passes.
  float* grad_q_sum = nullptr;

  BCD_HD bool varlen() const { return cu_seqlens_q != nullptr; }
  BCD_HD int64_t group() const { return heads_q / heads_kv; }
};

/// Whether packed sequence offsets [q0, q1) and [k0, k1) lie within the
/// tokens and the longest lengths; every backend treats a sequence that
/// fails this as empty.
BCD_HD bool packing_valid(const Problem& p, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  return 0 <= q0 && q0 <= q1 && q1 <= p.tokens_q && 0 <= k0 && k0 <= k1 && k1 <= p.tokens_kv &&
         q1 - q0 <= p.seq_q && k1 - k0 <= p.seq_kv;
}

/// Where query i sits on the key axis: i, or i + Lk - Lq when bottom-right aligned.
BCD_HD int64_t query_position(const Problem& p, int64_t i, int64_t len_q, int64_t len_kv) {
  return p.bottom_right ? i + len_kv - len_q : i;
}

/// The first and one-past-last keys query i may see (causal rule and window);
/// an empty range when none.
BCD_HD void key_range(const Problem& p, int64_t i, int64_t len_q, int64_t len_kv, int64_t& lo, int64_t& hi) {
  const int64_t pos = query_position(p, i, len_q, len_kv);
  lo = 0, hi = len_kv;
  if (p.causal && pos + 1 < hi) hi = pos + 1;
  if (p.window_right >= 0 && pos + p.window_right + 1 < hi) hi = pos + p.window_right + 1;
  if (p.window_left >= 0 && pos - p.window_left > lo) lo = pos - p.window_left;
  if (hi < lo) hi = lo;
}

/// key_range as offsets: key j < len_kv is in the range of row i < len_q
/// iff dmin <= j - (i + shift) <= dmax (shift: query_position's), so that a
/// tile on a causal or window edge tests each score with a subtraction and
/// two compares (the backward's TileRule::bounds).
struct KeyOffsets {
  int64_t shift, dmin, dmax;
  BCD_HD KeyOffsets(const Problem& p, int64_t len_q, int64_t len_kv)
      : shift(p.bottom_right ? len_kv - len_q : 0),
        dmin(p.window_left >= 0 ? -p.window_left : INT64_MIN),
        dmax(p.causal ? 0 : p.window_right >= 0 ? p.window_right : INT64_MAX) {}
  BCD_HD bool holds(int64_t offset) const { return offset >= dmin && offset <= dmax; }
};

// Note [Attention dropout draws]
// One Philox-4x32-7 call (seven rounds, as FlashAttention-2 draws its dropout:
// the fewest Salmon et al. 2011 rate Crush-resistant; ten, their default, adds
// a margin at 3/7 more work) gives 8 draws of 16 bits, one for each score of a
// group: rows {i, i + 8} x keys {j, j + 1, j + 8, j + 9} with i and j the
// group's first row and key (bit 3 of i, bits 0 and 3 of j clear). The
// tensor-core kernels hold a whole group per thread in the forward and the dQ
// pass (rows g, g + 8 x keys 2 quad, +1 of two 8-key tiles: one call per 8
// scores) and half of two groups in the dK/dV pass (two lanes share their two
// groups' calls: one per 8 again, dropout_bits_keys); the draw is a pure
// function of (seed, offset, b, h, i, j) wherever it is made. A score is kept
// when its draw is at or above round(p 2^16), and a kept probability is scaled
// by 2^16 / (2^16 - that threshold): 1 / (1 - p) to 16 bits, so the expected
// weight stays exact (p's rounding moves the drop rate by at most 2^-17).
// Positions are within the sequence (packed sequences draw as if dense).

/// The group's threshold: a draw below it drops the score.
BCD_HD uint32_t dropout_threshold(float p) {
  const float t = p * 65536.f + 0.5f;
  return t >= 65535.f ? 65535u : uint32_t(t);
}

inline constexpr int kDropoutPhiloxRounds = 7;

/// The 8 draws of the group holding score (i, j) of head (b, h).
BCD_HD PhiloxWords dropout_draws(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t head = p.offset + uint64_t(b) * uint64_t(p.heads_q) + uint64_t(h);
  return philox<kDropoutPhiloxRounds>(p.seed, uint32_t(j & ~int64_t(9)), uint32_t(i & ~int64_t(8)), uint32_t(head),
                                      uint32_t(head >> 32));
}

/// The draw of a group's score whose row has bit 3 `row_hi` and whose key
/// has bit 3 `key_hi` and bit 0 `key_odd`: word 2 row_hi + key_hi, high half
/// when key_odd. Selects, not an indexed word: an index the compiler cannot
/// fold would put the words in local memory.
BCD_HD uint32_t group_draw(const PhiloxWords& w, bool row_hi, bool key_hi, bool key_odd) {
  const uint32_t word = row_hi ? (key_hi ? w.v[3] : w.v[2]) : (key_hi ? w.v[1] : w.v[0]);
  return key_odd ? word >> 16 : word & 0xffffu;
}

/// Score (i, j)'s 16-bit draw from its group's words.
BCD_HD uint32_t dropout_draw(const PhiloxWords& w, int64_t i, int64_t j) {
  return group_draw(w, (i >> 3) & 1, (j >> 3) & 1, j & 1);
}

/// Whether dropout keeps score (i, j) of head (b, h).
BCD_HD bool dropout_keep(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return dropout_draw(dropout_draws(p, b, h, i, j), i, j) >= dropout_threshold(p.dropout_p);
}

}  // namespace baracuda::attn
