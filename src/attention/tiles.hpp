// Tile sizes of the bespoke CUDA attention kernels and the shared memory
// they need, visible to the plan (which refuses what a device cannot hold).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention/problem.hpp"

namespace baracuda::attn::tiles {

/// Testing hook, process-wide: with false, sm_90 leaves the Hopper
/// (warpgroup-MMA) kernels aside and runs the mma.sync ones that every other
/// arch runs, so that their tests run on a Hopper too. True by default;
/// false from the start with BARACUDA_ATTENTION_HOPPER=0 (their benchmarks).
void set_hopper_kernels(bool on);
bool hopper_kernels();

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxDim = 256;          ///< head_dim and value_dim
constexpr int kRowsPerWarp = 2;       ///< forward and dQ: rows of a warp
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kKeys = 32;             ///< forward and dQ: keys per tile (one per lane)
constexpr int kRowsBwd = 32;          ///< dK/dV: query rows per tile (one per lane)
/// dK/dV: keys each warp owns (f64 keeps fewer: its accumulators are twice the registers).
constexpr int keys_per_warp(size_t acc_bytes) { return acc_bytes == 8 ? 2 : 4; }

inline size_t forward_smem(int64_t d, int64_t dv, size_t acc) {
  return acc * size_t(kRows * d + kKeys * (d + 1) + kKeys * dv + kRows * kKeys);
}
inline size_t grad_q_smem(int64_t d, int64_t dv, size_t acc) {
  return acc * size_t(kRows * d + kRows * dv + kKeys * (d + 1) + kKeys * (dv + 1) + kRows * kKeys);
}
inline size_t grad_kv_smem(int64_t d, int64_t dv, size_t acc) {
  const int64_t keys = kWarps * keys_per_warp(acc);
  return acc * size_t(keys * d + keys * dv + kRowsBwd * (d + 1) + kRowsBwd * (dv + 1) + 2 * kRowsBwd);
}

/// Tensor-core kernels (f16/bf16, tensor_core.cuh): 64-row tiles padded to
/// a pitch of d + 8 elements. The backward's dK/dV and dQ kernels each keep
/// six such tiles (and the dK/dV kernel two stages of 64 lse and dO . O).
constexpr size_t tc_backward_smem(int64_t d) { return size_t(6 * 64 * (d + 8)) * 2 + 4 * 64 * sizeof(float); }

/// The head dim the tensor-core kernels are built for that holds `d`: 64 or
/// 128. A smaller multiple of 8 runs padded: its tiles' columns past d are
/// zeros (issue_tile), which add nothing to q.k, and the dims past it are not
/// written.
constexpr int tc_head_dim(int64_t d) { return d <= 64 ? 64 : 128; }

/// Whether the tensor-core kernels take a problem on a device of compute
/// capability `sm`: f16/bf16, equal head dims, multiples of 8 up to 128
/// (64 and 128 exactly, the others padded: tc_head_dim), unit dim strides
/// and 16-byte aligned rows of the operands they copy by tiles (q, k, v; and
/// grad_out for the backward), sm_80+.
inline bool tensor_core_layout(const Problem& p, int sm) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if (p.head_dim != p.value_dim || p.head_dim % 8 || p.head_dim < 8 || p.head_dim > 128 || sm < 80) return false;
  for (const Operand* o : {&p.q, &p.k, &p.v, &p.grad_out}) {
    if (o == &p.grad_out && !p.backward) continue;
    if (o->dim != 1 || o->seq % 8 || o->head % 8 || o->batch % 8 || reinterpret_cast<uintptr_t>(o->data) % 16)
      return false;
  }
  return true;
}

/// The Hopper forward (kernels_fwd_sm90.cu, warpgroup MMA): 128 query rows
/// a block, three warpgroups (a producer that loads, two consumers of 64
/// rows each), 128-key tiles, a ring of K/V stages (3 at head dim 64, 2 at
/// 128) in the 128-byte swizzled layout, 1024-byte aligned, then each
/// consumer's output staging tile (64 rows at a pitch of d + 8), then the
/// mbarriers (Q full, Q empty and four a stage).
constexpr int kWgRows = 128, kWgKeys = 128, kWgThreads = 384;
constexpr int wgmma_stages(int64_t d) { return d == 64 ? 3 : 2; }
constexpr size_t wgmma_forward_smem(int64_t d) {
  return size_t(kWgRows * d + wgmma_stages(d) * 2 * kWgKeys * d + 2 * 64 * (d + 8)) * 2 + 1024 +
         8 * (2 + 4 * wgmma_stages(d));
}

/// The order of the Hopper forward's blocks on its 1-d grid (Note [Hopper
/// block order] in kernels_fwd_sm90.cu): the (batch, head) pairs in sections
/// of `section`; in each, the query blocks from the first (from the last
/// where `heavy_first`) with the pairs fastest.
struct BlockOrder {
  int64_t q_blocks = 1, section = 1;
  bool heavy_first = false;
};

/// Causal problems heaviest first in sections whose K and V fit in 32 MiB
/// of L2 (a multiple of the query heads that share a key head); the rest in
/// one order of query blocks fastest.
inline BlockOrder wgmma_block_order(const Problem& p) {
  constexpr int64_t kL2Share = int64_t(32) << 20;
  BlockOrder o;
  o.q_blocks = (p.seq_q + kWgRows - 1) / kWgRows;
  o.heavy_first = p.causal;
  const int64_t pairs = p.batch * p.heads_q;
  if (o.heavy_first && pairs > 0) {
    const int64_t kv_head = std::max<int64_t>(p.seq_kv, 1) * (p.head_dim + p.value_dim) * 2;
    o.section = std::clamp<int64_t>(std::max<int64_t>(kL2Share / kv_head, 1) * p.group(), 1, pairs);
  }
  return o;
}

/// Block `idx` of the grid in order `o` as (batch, head, query block).
BCD_HD void block_at(const Problem& p, const BlockOrder& o, int64_t idx, int64_t& b, int64_t& h, int64_t& qb) {
  const int64_t pairs = p.batch * p.heads_q, per = o.section * o.q_blocks;
  const int64_t first = idx / per * o.section, r = idx % per;
  const int64_t n = pairs - first < o.section ? pairs - first : o.section;  // the last section may be short
  qb = o.heavy_first ? o.q_blocks - 1 - r / n : r / n;
  const int64_t bh = first + r % n;
  b = bh / p.heads_q, h = bh % p.heads_q;
}

/// Whether the Hopper forward takes a problem on a device of compute
/// capability `sm` with `sm_count` SMs and `max_smem` bytes of opt-in shared
/// memory: a forward tensor_core_layout takes, on sm_90 (its sm_90a code runs
/// nowhere else), in a build with sm_90a code, with fewer than 2^31 blocks
/// (a 1-d grid); head dims other than 64 and 128 run padded (tc_head_dim:
/// TMA zero-fills the columns past the operand's, cp.async skips them).
/// Where it does not pay, the mma.sync kernel serves: grids of fewer 128-row
/// blocks than half the SMs (H200, bf16 D128: at 64 blocks on 132 SMs both
/// kernels take the same time, B1 H8 S1024 93 / 96 TFLOP/s; at 128 blocks
/// the wgmma kernel 3x the mma.sync one's, B1 H4 S4096 causal 305 / 102).
/// Dropout runs in kernel instances of its own (the plain ones carry no
/// dropout code).
inline bool wgmma_layout(const Problem& p, int sm, int sm_count, size_t max_smem) {
#ifdef BARACUDA_HAS_SM90A
  const int64_t blocks = p.batch * p.heads_q * ((p.seq_q + kWgRows - 1) / kWgRows);
  return !p.backward && sm == 90 && hopper_kernels() && 2 * blocks >= sm_count && blocks < (int64_t(1) << 31) &&
         tensor_core_layout(p, sm) && wgmma_forward_smem(tc_head_dim(p.head_dim)) <= max_smem;
#else
  (void)p, (void)sm, (void)sm_count, (void)max_smem;
  return false;
#endif
}

/// The Hopper backward (kernels_bwd_sm90.cu, warpgroup MMA): a warpgroup
/// a block, two blocks an SM; each block keeps six swizzled tiles of 64 rows
/// by d (K, V and two stages of Q and dO; or Q, dO and two stages of K and
/// V), 1024-byte aligned, and two stages of 64 lse and dO . O.
constexpr size_t wgmma_backward_smem(int64_t d) { return size_t(6 * 64 * d) * 2 + 1024 + 4 * 64 * sizeof(float); }

/// Whether the Hopper backward takes a problem: one a backward
/// tensor_core_layout takes (head dims other than 64 and 128 padded to them,
/// tc_head_dim, as the forward's), on sm_90 in a build with sm_90a code.
inline bool wgmma_backward_layout(const Problem& p, int sm, size_t max_smem) {
#ifdef BARACUDA_HAS_SM90A
  return p.backward && sm == 90 && hopper_kernels() && tensor_core_layout(p, sm) &&
         wgmma_backward_smem(tc_head_dim(p.head_dim)) <= max_smem;
#else
  (void)p, (void)sm, (void)max_smem;
  return false;
#endif
}

/// The one-pass backward's dQ sums (Note [One-pass Hopper backward]): each
/// 64-row query tile of a head holds two parts of 64 rows by 64 columns
/// (dims 0..63, then 64..127), a part's rows kDqPitch floats apart (8 more
/// than 64: shared-memory banks), so that a part is one contiguous bulk reduction.
constexpr int64_t kDqPitch = 72;
constexpr int64_t kDqTileFloats = 2 * 64 * kDqPitch;
constexpr int64_t dq_padded_rows(int64_t seq) { return (seq + 63) / 64 * 64; }

/// Stages of the one-pass Hopper backward's Q and dO ring: three, so that a
/// tile's dK and dV products may still read theirs while the next tile's
/// copies land (Note [One-pass Hopper backward]).
constexpr int kOnePassStages = 3;

/// The one-pass Hopper backward's shared memory (head dim 128): K and V of
/// 128 keys, the stages of 64-row Q and dO, dS^T (128 x 64 halves), the two
/// dQ parts of a tile (f32), the stages' lse and dO . O, the 1024-byte
/// alignment (215 KiB).
constexpr size_t wgmma_one_pass_smem() {
  return size_t(4 + 2 * kOnePassStages) * 64 * 128 * 2 + 128 * 64 * 2 + size_t(kDqTileFloats) * 4 +
         2 * kOnePassStages * 64 * sizeof(float) + 1024;
}

/// Whether the Hopper backward takes a problem in one pass, dQ summed by
/// bulk f32 reductions (Note [One-pass Hopper backward]): one at head dim
/// 128 (or padded to it) that wgmma_backward_layout takes, whose run need
/// not be bitwise reproducible (at head dim 64 one warpgroup would carry the
/// whole dQ product: slower than the two passes).
inline bool wgmma_one_pass(const Problem& p, int sm, size_t max_smem) {
  return !p.deterministic && tc_head_dim(p.head_dim) == 128 && wgmma_backward_layout(p, sm, max_smem) &&
         wgmma_one_pass_smem() <= max_smem;
}

/// Where the one-pass backward's f32 dQ sums start in the workspace: after
/// the per-row statistics (RowStats: lse and dO . O, two floats),
/// 256-byte aligned.
constexpr size_t grad_q_sum_offset(const Problem& p) {
  return (size_t(p.batch * p.heads_q * p.seq_q) * 2 * sizeof(float) + 255) / 256 * 256;
}
/// Workspace bytes of the one-pass backward: the rows' statistics, then the dQ sums.
constexpr size_t one_pass_workspace(const Problem& p) {
  return grad_q_sum_offset(p) + size_t(p.batch * p.heads_q * dq_padded_rows(p.seq_q) / 64 * kDqTileFloats) * sizeof(float);
}

}  // namespace baracuda::attn::tiles
