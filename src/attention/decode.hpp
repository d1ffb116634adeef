// Flash decoding: one new query token per sequence against a paged (or
// per-sequence contiguous) KV cache. The raw-pointer problem the host
// reference and the CUDA kernels share, and the score rules both apply.
#pragma once

#include "attention/problem.hpp"

namespace baracuda::attn {

/// The largest cache capacity (max_blocks * block_size, or S_max) the CUDA
/// kernels take: key positions are 32-bit there.
inline constexpr int64_t kDecodeMaxCapacity = (int64_t(1) << 31) - (int64_t(1) << 16);
/// The most key splits a CUDA plan uses.
inline constexpr int kDecodeMaxSplits = 1024;

/// out[b, h] = sum_j softmax_j(score(q[b, h] . k[b, j])) v[b, j] over the
/// keys j in [first_key(len, window_left), len), len = seq_lens[b]; key j of
/// sequence b lives in block `table[b, j / block_size]` (paged) or in
/// sequence b's own slab (table null: contiguous), at row j % block_size.
/// All strides are in elements; kv head h / group serves query head h.
struct DecodeProblem {
  DType dtype = DType::bf16;  ///< q, k, v, out
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0, value_dim = 0;
  int64_t num_blocks = 0;  ///< paged: blocks in the cache; contiguous: batch
  int64_t block_size = 0;  ///< paged: tokens per block; contiguous: S_max
  int64_t max_blocks = 0;  ///< paged: table columns; contiguous: 1

  const char* q = nullptr;
  int64_t q_batch = 0, q_head = 0, q_dim = 0;
  const char* k = nullptr;  ///< [block, row, head, dim]
  int64_t k_block = 0, k_row = 0, k_head = 0, k_dim = 0;
  const char* v = nullptr;
  int64_t v_block = 0, v_row = 0, v_head = 0, v_dim = 0;
  const int32_t* table = nullptr;  ///< [batch, max_blocks]; null: contiguous
  int64_t table_batch = 0, table_col = 0;
  const int32_t* seq_lens = nullptr;
  int64_t seq_lens_stride = 0;

  char* out = nullptr;
  int64_t out_batch = 0, out_head = 0, out_dim = 0;
  char* lse = nullptr;  ///< f32 (f64 for f64)
  int64_t lse_batch = 0, lse_head = 0;

  double scale = 1, softcap = 0;  ///< softcap > 0: score = softcap * tanh(score / softcap)
  int64_t window_left = -1;       ///< -1: unbounded

  /// CUDA: the key axis [0, capacity) is cut into `splits` ranges of
  /// `split_len` keys; with splits > 1 each writes a partial (out, lse) to
  /// the workspace, [batch * heads_q, splits] rows of value_dim + 1 math-type values.
  int splits = 1;
  int64_t split_len = 0;
  void* workspace = nullptr;

  BCD_HD int64_t group() const { return heads_q / heads_kv; }
  BCD_HD int64_t capacity() const { return max_blocks * block_size; }
};

/// The first key a query at position len - 1 may see: the attention
/// family's window rule for a bottom-right aligned single query.
BCD_HD int64_t decode_first_key(int64_t len, int64_t window_left) {
  Problem p;
  p.bottom_right = true;
  p.window_left = window_left;
  int64_t lo = 0, hi = 0;
  key_range(p, 0, 1, len, lo, hi);
  return lo;
}

/// A raw score q . k scaled and soft-capped, in the math type M.
template <class M>
BCD_HD M decode_score(M dot, M scale, M softcap) {
  const M s = dot * scale;
  if (!(softcap > M(0))) return s;
  if constexpr (std::is_same_v<M, float>) return softcap * tanhf(s / softcap);
  else return softcap * tanh(s / softcap);
}

/// CUDA builds: how many tensor-core split CTAs (head dim 64 or 128) fit an
/// SM of the current device; 0 where unknown (no device, other head dims).
int decode_tc_resident_ctas(int64_t head_dim);

/// Runs a decode problem: the host reference (f64) or the CUDA kernels.
/// Keys "decode_attention:dtype". The CUDA table also holds
/// "decode_padding_lengths:dtype" (f16, bf16): what cuDNN's padding mask
/// needs before it serves a decode problem (Note [Decode on cuDNN] in
/// decode.cpp), written to p.workspace as int32 len_q[batch] then
/// len_kv[batch]: len_kv[b] = seq_lens[b] clamped to [0, capacity], len_q[b]
/// = 1 where that is positive and 0 otherwise; an empty sequence's rows get
/// out = 0, lse = -inf (cuDNN computes and writes no row of a sequence
/// without queries).
using DecodeFn = Status (*)(const DecodeProblem&, CUstream_st*);
using DecodeTable = LaunchTable<DecodeFn>;
DecodeTable& host_decode();
DecodeTable& cuda_decode();

}  // namespace baracuda::attn
