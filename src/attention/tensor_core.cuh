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
/// into a tile with a pitch of kD + 8; rows at or past `len` are zero-filled.
template <int kD, class T>
__device__ __forceinline__ void issue_tile(T* s, const T* base, int64_t seq, int64_t row0, int64_t len) {
  constexpr int kPerRow = kD / 8;
  for (int e = threadIdx.x; e < 64 * kPerRow; e += kTcThreads) {
    const int r = e / kPerRow, c = e % kPerRow;
    const int64_t i = row0 + r;
    cp_async_16(s + r * (kD + 8) + c * 8, i < len ? base + i * seq + c * 8 : base, i < len);
  }
}

/// One step of the K/V double buffer: issues the copy of the key and value
/// rows from `next` into `dst` (K, then V one tile further) when `next` is
/// before `end`, then waits for the stage issued one step earlier, so that the
/// next tile streams in while this one is used. Every thread calls it.
template <int kD, class T>
__device__ __forceinline__ void await_kv_stage(T* dst, const T* k, int64_t k_seq, const T* v, int64_t v_seq,
                                               int64_t next, int64_t end, int64_t len_kv) {
  if (next < end) {
    issue_tile<kD>(dst, k, k_seq, next, len_kv);
    issue_tile<kD>(dst + tc_tile<kD>(), v, v_seq, next, len_kv);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
}

/// Whether no score of the tile needs the rule: every key is inside every
/// row's range and there is no mask, ALiBi or softcap.
__device__ __forceinline__ bool tile_plain(const Problem& p, const HeadView& v, int64_t row0, int64_t row_last,
                                           int64_t k0, int keys) {
  if (p.mask.data || p.alibi_slopes || p.softcap > 0 || k0 + keys > v.len_kv) return false;
  int64_t lo_first, hi_first, lo_last, hi_last;
  key_range(p, row0, v.len_q, v.len_kv, lo_first, hi_first);
  key_range(p, row_last, v.len_q, v.len_kv, lo_last, hi_last);
  return k0 >= lo_last && k0 + keys <= hi_first;
}

/// The backward on tensor cores (kernels_bwd_tc.cu) for a problem
/// tensor_core_layout takes, after the per-row dO . O in `ws`.
template <class T>
Status attention_backward_tc(const Problem& p, const float* ws, CUstream_st* stream);

}  // namespace baracuda::attn
