// Pieces the tensor-core flash kernels (forward, dQ and dK/dV) share: the
// tile shape, 16-byte tile copies into padded shared memory, the test for a
// tile no score rule touches, and the layouts they accept.
#pragma once

#include "attention/kernels.cuh"

namespace baracuda::attn {

constexpr int kTcWarps = 4, kTcThreads = kTcWarps * 32, kTcRows = 16 * kTcWarps, kTcKeys = 64;
static_assert(kTcRows == kTcKeys, "the tile copies move 64 rows, query or key");
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

/// Whether the tensor-core kernels take the problem: equal head dims of 64 or
/// 128, unit dim strides and 16-byte aligned rows of the operands they copy
/// by tiles (q, k, v; grad_out too for the backward), sm_80+.
inline bool tensor_core_layout(const Problem& p) {
  if (p.head_dim != p.value_dim || (p.head_dim != 64 && p.head_dim != 128) || current_sm_version() < 80) return false;
  for (const Operand* o : {&p.q, &p.k, &p.v, &p.grad_out}) {
    if (o == &p.grad_out && !p.backward) continue;
    if (o->dim != 1 || o->seq % 8 || o->head % 8 || o->batch % 8 || reinterpret_cast<uintptr_t>(o->data) % 16)
      return false;
  }
  return true;
}

/// The backward on tensor cores (kernels_bwd_tc.cu) for a problem
/// tensor_core_layout takes, after the per-row dO . O in `ws`; the shared
/// memory its dK/dV kernel asks for (the larger of its two).
template <class T>
Status attention_backward_tc(const Problem& p, const float* ws, CUstream_st* stream);
size_t backward_tc_smem(int64_t head_dim);

}  // namespace baracuda::attn
