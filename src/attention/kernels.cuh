// Pieces the bespoke CUDA attention kernels share: the accumulator type,
// warp reductions, tile loads into shared memory, and launch plumbing.
// These are the generic flash kernels: tiled, online softmax, any strides,
// every option of the score rule, f32/f64 math on CUDA cores.
#pragma once

#include <cuda_runtime.h>

#include "attention/device.cuh"
#include "attention/engine.hpp"
#include "attention/score.hpp"
#include "attention/tiles.hpp"
#include "core/cuda_check.hpp"

namespace baracuda::attn {

using namespace tiles;

/// Accumulators (and lse): f32, f64 for f64, as every family's device math.
template <class T>
using acc_of = math_t<T, false>;

constexpr int kChunks = kMaxDim / 32;  ///< dims of a row a lane holds (d = lane + 32 c)

/// s[r * pitch + d] = base[(row0 + r) * seq + d * dim] for r < rows, d < width,
/// as Acc; rows at or past `len` read 0. Consecutive threads take consecutive d.
template <class T, class Acc>
__device__ void load_rows(Acc* s, int pitch, const T* base, int64_t seq, int64_t dim, int64_t row0, int rows,
                          int64_t len, int width) {
  for (int e = threadIdx.x; e < rows * width; e += kThreads) {
    const int r = e / width, d = e % width;
    const int64_t i = row0 + r;
    s[r * pitch + d] = i < len ? convert<Acc>(base[i * seq + d * dim]) : Acc(0);
  }
}

/// Index of row i of (b, h) in the backward's per-row dO . O scratch.
__device__ __forceinline__ int64_t row_index(const Problem& p, const HeadView& v, int64_t i) {
  return (v.b * p.heads_q + v.h) * p.seq_q + i;
}

/// Index of the one-pass backward's dQ sum of row i of head view v, dim d
/// (the layout of tiles::kDqPitch; head dim 128).
__device__ __forceinline__ int64_t grad_q_sum_index(const Problem& p, const HeadView& v, int64_t i, int64_t d) {
  const int64_t tile = ((v.b * p.heads_q + v.h) * dq_padded_rows(p.seq_q) + i) / 64;
  return tile * kDqTileFloats + d / 64 * 64 * kDqPitch + i % 64 * kDqPitch + d % 64;
}

/// The keys [lo, hi) any of rows [first, last] may see (key ranges grow with the row).
__device__ __forceinline__ void tile_key_span(const Problem& p, const HeadView& v, int64_t first, int64_t last,
                                              int64_t& lo, int64_t& hi) {
  int64_t a, b;
  key_range(p, first, v.len_q, v.len_kv, lo, a);
  key_range(p, last, v.len_q, v.len_kv, b, hi);
}

}  // namespace baracuda::attn
