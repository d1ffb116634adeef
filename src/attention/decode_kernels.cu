// Split-K flash decoding over a paged or contiguous KV cache.
//
// Note [Decode kernel]
// One CTA of kThreads serves (sequence b, kv head, group chunk, key split):
// every query head of the chunk (up to kG of the Hq / Hkv heads that share
// the kv head) is scored against each K row the CTA reads, so K and V stream
// from HBM once per chunk (once in total when the group fits one chunk).
// Keys arrive in tiles of kTile rows, K and V in a ring of kStages shared
// memory stages (cp.async, 16-byte chunks, zero-filled for masked rows, so
// kStages - 1 tiles stream in while one is used) on the fast path; the
// generic path (any dtype, head dim <= 256, any strides) fills the same
// tiles with scalar loads. Thread (r, c) owns chunk c (kChunk elements of
// the head dim) of rows r, r + kRowsPerPass, ... of every tile: it copies
// exactly the slices it later reads, so the key loop has no block barrier.
// Its q slices and its slice of the output accumulators live in registers;
// a score is reduced over the kRowChunks lanes of a row by xor shuffles.
// Each warp keeps its own online softmax (max and sum per head, f32; f64
// for f64) over the rows it owns, and the warps merge once, in order, at
// the end of the split. A split writes its normalised partial output and
// lse to the workspace; decode_combine merges the splits of a row in split
// order. Every sum runs in a fixed order: the result is bitwise reproducible.
// Positions are 32-bit (the plan bounds the cache capacity), element offsets
// 64-bit. Out-of-range block-table entries and seq_lens beyond the capacity
// never reach memory: their keys are masked.
#include <cstdint>
#include <limits>
#include <utility>

#include "attention/decode.hpp"
#include "attention/device.cuh"
#include "core/cuda_check.hpp"
#include "core/device_memo.hpp"

namespace baracuda::attn {

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kChunk = 8;             ///< head-dim elements per thread slice
constexpr int kStageBytes = 8192;     ///< one operand's tile in one stage
constexpr int kStages = 3;            ///< K/V tiles in the ring: kStages - 1 in flight ahead of the one in use
constexpr int kMaxSplits = kDecodeMaxSplits;  ///< decode_combine's weight buffer

template <class T>
inline constexpr bool kHalfType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <class T, int kDim, int kG>
struct Cfg {
  using M = math_t<T, false>;
  using LseT = std::conditional_t<std::is_same_v<T, double>, double, float>;
  static constexpr int kRowChunks = kDim / kChunk;                 // 8, 16, 32 lanes per row
  static constexpr int kRowsPerPass = kThreads / kRowChunks;        // rows the CTA covers at once
  static constexpr int kTile = kStageBytes / (kDim * int(sizeof(T)));  // keys per tile
  static constexpr int kPasses = kTile / kRowsPerPass;
  static_assert(kRowChunks <= 32 && kPasses >= 1 && kPasses <= 8 && kTile % kRowsPerPass == 0);
  static_assert(kStages * 8 <= 32, "one byte of row flags per stage");

  struct Smem {
    alignas(16) T kv[kStages][2][kTile * kDim];  // [stage][k | v][key][dim]
  };
  // After the key loop the tiles hold the warps' partial outputs and states.
  static constexpr size_t kMergeBytes = sizeof(M) * (size_t(kWarps) * kG * kDim + 2 * kWarps * kG);
  static_assert(kMergeBytes <= sizeof(Smem));
};

template <class M>
__device__ __forceinline__ M m_exp(M x) {
  if constexpr (std::is_same_v<M, float>) return expf(x);
  else return exp(x);
}
template <class M>
__device__ __forceinline__ M m_log(M x) {
  if constexpr (std::is_same_v<M, float>) return logf(x);
  else return log(x);
}
template <class M>
__device__ __forceinline__ M m_max(M a, M b) {
  return a > b ? a : b;
}
/// kChunk elements at `src` (16-byte aligned shared memory) in the math type.
template <class T, class M>
__device__ __forceinline__ void load_chunk(const T* src, M (&dst)[kChunk]) {
  constexpr int kVecs = kChunk * int(sizeof(T)) / 16;
  uint4 raw[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) raw[i] = reinterpret_cast<const uint4*>(src)[i];
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) dst[i] = convert<M>(e[i]);
}

/// What a CTA of a split kernel serves: grid x = (sequence b, kv head, chunk
/// of `per_chunk` query heads), y = split; its keys [begin, end) are the
/// split's part of [first key, len) (len clamped to the capacity).
struct SplitUnit {
  int64_t b, hkv, h0;
  int split, heads, begin, end;
  __device__ SplitUnit(const DecodeProblem& p, int chunks, int per_chunk) {
    int64_t unit = blockIdx.x;
    const int chunk = int(unit % chunks);
    unit /= chunks;
    hkv = unit % p.heads_kv, b = unit / p.heads_kv;
    split = blockIdx.y;
    const int64_t group = p.group(), g0 = int64_t(chunk) * per_chunk;
    heads = int(group - g0 < per_chunk ? group - g0 : per_chunk);
    h0 = hkv * group + g0;
    const int cap = int(p.capacity());
    const int64_t asked = p.seq_lens[b * p.seq_lens_stride];
    const int len = int(asked < 0 ? 0 : asked > cap ? cap : asked);
    const int lo = int(decode_first_key(len, p.window_left));
    const int split0 = int(split * p.split_len);
    begin = split0 > lo ? split0 : lo;
    end = int(split0 + p.split_len < len ? split0 + p.split_len : len);
  }
};

/// See Note [Decode kernel]. Grid: x = (b, kv head, group chunk), y = split.
template <class T, int kDim, int kG, bool kVec>
__global__ void __launch_bounds__(kThreads) decode_split(const DecodeProblem p, int chunks) {
  using C = Cfg<T, kDim, kG>;
  using M = typename C::M;
  using Smem = typename C::Smem;
  constexpr int kTile = C::kTile, kPasses = C::kPasses, kRowChunks = C::kRowChunks, kRowsPerPass = C::kRowsPerPass;
  __shared__ alignas(16) unsigned char raw[sizeof(Smem)];
  Smem& sm = *reinterpret_cast<Smem*>(raw);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int c = tid % kRowChunks, r = tid / kRowChunks;
  const SplitUnit u(p, chunks, kG);
  const int64_t hkv = u.hkv, b = u.b, h0 = u.h0;
  const int split = u.split, heads = u.heads, begin = u.begin, end = u.end;

  const T* gK = reinterpret_cast<const T*>(p.k) + hkv * p.k_head;  // [block, row, dim]
  const T* gV = reinterpret_cast<const T*>(p.v) + hkv * p.v_head;
  const int block_size = int(p.block_size);
  const int32_t* table = p.table ? p.table + b * p.table_batch : nullptr;

  // Table entries of the rows this thread loads in the next tile to issue:
  // fetched one tile ahead, so that their latency hides behind a tile's math.
  int32_t entry[kPasses];
  auto fetch_entries = [&](int t0) {
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int j = t0 + ps * kRowsPerPass + r;
      entry[ps] = table && j < end ? __ldg(table + int64_t(j / block_size) * p.table_col) : int32_t(b);
    }
  };
  // Rows of the tile at t0 into stage `st`; bit st * 8 + ps of `valid` says
  // whether this thread's row of pass ps is a key to score. A thread reads
  // back only the (row, chunk) slices it copied itself, so neither the copy
  // nor the reuse of a stage needs a block barrier.
  uint32_t valid = 0;
  auto issue = [&](int t0, int st) {
    valid &= ~(0xFFu << (st * 8));
    // Offsets may be negative (negative strides): `ok` says which rows load.
    int64_t off_k[kPasses], off_v[kPasses];
    bool ok[kPasses];
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int j = t0 + ps * kRowsPerPass + r;
      const int64_t blk = entry[ps];
      const int row = table ? j % block_size : j;
      ok[ps] = j < end && blk >= 0 && blk < p.num_blocks;
      valid |= uint32_t(ok[ps]) << (st * 8 + ps);
      off_k[ps] = ok[ps] ? blk * p.k_block + row * p.k_row : 0;
      off_v[ps] = ok[ps] ? blk * p.v_block + row * p.v_row : 0;
    }
#pragma unroll
    for (int op = 0; op < 2; ++op) {  // K, then V: one commit group each
      const T* src = op == 0 ? gK : gV;
      const int dims = int(op == 0 ? p.head_dim : p.value_dim);
      const int64_t dstride = op == 0 ? p.k_dim : p.v_dim;
#pragma unroll
      for (int ps = 0; ps < kPasses; ++ps) {
        const int n = ps * kRowsPerPass + r;
        T* dst = &sm.kv[st][op][n * kDim + c * kChunk];
        const int64_t off = op == 0 ? off_k[ps] : off_v[ps];
        if constexpr (kVec) {
          cp_async_16(dst, ok[ps] ? src + off + c * kChunk : src, ok[ps]);
        } else {
#pragma unroll
          for (int e = 0; e < kChunk; ++e) {
            const int d = c * kChunk + e;
            dst[e] = ok[ps] && d < dims ? src[off + d * dstride] : convert<T>(0.0f);
          }
        }
      }
      cp_async_commit();
    }
  };
  // Commits per tile: 2 (K, V); an absent tile commits two empty groups so
  // that the pending counts below stay uniform.
  auto issue_tile = [&](int it, int tiles) {
    if (it < tiles) {
      issue(begin + it * kTile, it % kStages);
      if (it + 1 < tiles) fetch_entries(begin + (it + 1) * kTile);
    } else {
      cp_async_commit();
      cp_async_commit();
    }
  };

  // This thread's slices of q, in registers.
  const T* gQ = reinterpret_cast<const T*>(p.q) + b * p.q_batch + h0 * p.q_head;
  M rQ[kG][kChunk], acc[kG][kChunk], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = neg_inf<M>(), l[g] = M(0);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int d = c * kChunk + e;
      rQ[g][e] = g < heads && d < p.head_dim ? convert<M>(gQ[g * p.q_head + d * p.q_dim]) : M(0);
      acc[g][e] = M(0);
    }
  }

  const M scale = M(p.scale), softcap = M(p.softcap);
  const int tiles = end > begin ? (end - begin + kTile - 1) / kTile : 0;
  if (tiles > 0) fetch_entries(begin);
#pragma unroll
  for (int it = 0; it < kStages - 1; ++it) issue_tile(it, tiles);

  for (int it = 0; it < tiles; ++it) {
    const int st = it % kStages;
    // The stage of tile it + kStages - 1 is the one this thread read at it - 1.
    issue_tile(it + kStages - 1, tiles);
    cp_async_wait<2 * kStages - 1>();  // this tile's K

    // Scores of this thread's rows, reduced over the row's lanes.
    M s[kPasses][kG];
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int n = ps * kRowsPerPass + r;
      M k[kChunk];
      load_chunk(&sm.kv[st][0][n * kDim + c * kChunk], k);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        s[ps][g] = M(0);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) s[ps][g] += rQ[g][e] * k[e];
      }
#pragma unroll
      for (int off = kRowChunks / 2; off > 0; off /= 2)
#pragma unroll
        for (int g = 0; g < kG; ++g) s[ps][g] += __shfl_xor_sync(0xFFFFFFFFu, s[ps][g], off);
      const bool ok = (valid >> (st * 8 + ps)) & 1u;
#pragma unroll
      for (int g = 0; g < kG; ++g) s[ps][g] = ok ? decode_score(s[ps][g], scale, softcap) : neg_inf<M>();
    }

    // Online softmax over this warp's rows of the tile (the warp's own state).
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      M tile_max = s[0][g];
#pragma unroll
      for (int ps = 1; ps < kPasses; ++ps) tile_max = m_max(tile_max, s[ps][g]);
#pragma unroll
      for (int off = kRowChunks; off < 32; off *= 2)
        tile_max = m_max(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, off));
      const M m_new = m_max(m[g], tile_max);
      const bool none = m_new == neg_inf<M>();
      const M alpha = none ? M(1) : m_exp(m[g] - m_new);
      M sum = M(0);
#pragma unroll
      for (int ps = 0; ps < kPasses; ++ps) {
        s[ps][g] = none ? M(0) : m_exp(s[ps][g] - m_new);
        sum += s[ps][g];
      }
      l[g] = l[g] * alpha + sum;
      m[g] = m_new;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[g][e] *= alpha;
    }

    cp_async_wait<2 * kStages - 2>();  // this tile's V
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int n = ps * kRowsPerPass + r;
      M v[kChunk];
      load_chunk(&sm.kv[st][1][n * kDim + c * kChunk], v);
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc[g][e] += s[ps][g] * v[e];
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the tiles become the merge buffers

  // Each warp sums its lanes that share a chunk (xor shuffles), then the
  // warps merge in order through shared memory, rescaled to the common max.
  M* red = reinterpret_cast<M*>(raw);  // [kWarps][kG][kDim]
  M* wm = red + kWarps * kG * kDim;    // [kWarps][kG] running max
  M* wl = wm + kWarps * kG;            // [kWarps][kG] running sum
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      M x = acc[g][e];
#pragma unroll
      for (int off = kRowChunks; off < 32; off *= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, off);
      if (lane < kRowChunks) red[(warp * kG + g) * kDim + c * kChunk + e] = x;
    }
    M x = l[g];
#pragma unroll
    for (int off = kRowChunks; off < 32; off *= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, off);
    if (lane == 0) wm[warp * kG + g] = m[g], wl[warp * kG + g] = x;
  }
  __syncthreads();

  using LseT = typename C::LseT;
  const int64_t splits = p.splits;
  for (int g = 0; g < heads; ++g) {
    M top = neg_inf<M>();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = m_max(top, wm[w * kG + g]);
    M weight[kWarps], l_all = M(0);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const M mw = wm[w * kG + g];
      weight[w] = mw == neg_inf<M>() ? M(0) : m_exp(mw - top);
      l_all += weight[w] * wl[w * kG + g];
    }
    const M inv = l_all > M(0) ? M(1) / l_all : M(0);
    const int64_t h = h0 + g, row = b * p.heads_q + h;
    for (int d = tid; d < p.value_dim; d += kThreads) {
      M total = M(0);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += weight[w] * red[(w * kG + g) * kDim + d];
      total *= inv;
      if (splits == 1) reinterpret_cast<T*>(p.out)[b * p.out_batch + h * p.out_head + d * p.out_dim] = convert<T>(total);
      else static_cast<M*>(p.workspace)[(row * splits + split) * p.value_dim + d] = total;
    }
    if (tid == 0) {
      const M lse = l_all > M(0) ? top + m_log(l_all) : neg_inf<M>();
      if (splits == 1) reinterpret_cast<LseT*>(p.lse)[b * p.lse_batch + h * p.lse_head] = LseT(lse);
      else static_cast<M*>(p.workspace)[p.batch * p.heads_q * splits * p.value_dim + row * splits + split] = lse;
    }
  }
}

// ---------------------------------------------------------------- tensor cores
//
// Note [Tensor-core decode]
// f16/bf16 with head dims 64 or 128 (equal for K and V) and 16-byte friendly
// K/V rows: the query heads of a chunk (up to 16 of the group) are the 16
// rows of an mma.sync m16n8k16 A operand, so S = Q K^T and O += P V run on
// tensor cores (rows past the group are zeros, never written). Each warp
// streams its own key steps (kTcKeys keys; warp w takes steps w, w + 4, ...
// of the split) through its own ring of kTcStages shared-memory stages: the
// lanes copy exactly the rows the warp reads, so there is no block barrier
// in the key loop. Rows are stored with their 16-byte chunks permuted by
// (row & 7), so the eight rows an ldmatrix reads fall in distinct banks.
// Steps lie on the kKeys grid of key positions; where the cache is
// contiguous, or paged with a block size a multiple of kKeys, a step's rows
// sit in one block and a lane copies its rows from one address by a fixed
// stride: about 15 instructions a row pair, where looking each row's block
// up took four times that (ncu, H100, B1: SM throughput 28% -> 18%; the
// kernel's time did not move, it waits on memory, 70% of DRAM peak). Lane
// x < kTcKeys looks up key x's block one step ahead; the step's valid keys
// become one ballot mask. Each warp keeps its own online softmax
// (scores in log2 units); the four warps merge in order at the end, and a
// split writes the same partials as the generic kernel. Both this kernel and
// the combine launch overlapped (launch_overlapped): each waits for the
// kernel before it first, so a call's launch hides under the previous
// kernel's drain (the combine's under the split's, the split's under the
// previous call's combine or whatever kernel wrote q and the cache).

template <int kDim>
struct TcCfg {
  static constexpr int kKeys = 2048 / kDim;            ///< keys per warp step: 16 (D 128) or 32 (D 64)
  static constexpr int kRowChunks = kDim / 8;          ///< 16-byte chunks per row
  static constexpr int kRowsPerCopy = 32 / kRowChunks;  ///< rows one warp-wide copy covers
  static constexpr int kCopies = kKeys / kRowsPerCopy;
  static constexpr int kStages = 3;
  static constexpr int kStageElems = 2 * kKeys * kDim;  ///< K then V
  static constexpr size_t kSmem = size_t(kWarps) * kStages * kStageElems * 2 + kWarps * kStages * sizeof(uint32_t);
  static constexpr size_t kMergeBytes = sizeof(float) * (size_t(kWarps) * 16 * kDim + 2 * kWarps * 16);
  static_assert(kMergeBytes <= kSmem && kKeys % 16 == 0 && kKeys <= 32);
};

/// Element offset of (row, chunk) in a swizzled tile of kDim-element rows.
template <int kDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kDim + ((chunk ^ (row & 7)) << 3);
}

template <class T, int kDim>
__global__ void __launch_bounds__(kThreads) decode_split_tc(const DecodeProblem p, int chunks) {
  using C = TcCfg<kDim>;
  constexpr int kKeys = C::kKeys, kKeyTiles = kKeys / 8, kDimTiles = kDim / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  wait_for_prerequisite_grid();  // launched overlapped: every operand may come from the previous kernel
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, quad = lane % 4, grp = lane / 4;
  T* ring = reinterpret_cast<T*>(smem) + size_t(warp) * C::kStages * C::kStageElems;
  uint32_t* masks = reinterpret_cast<uint32_t*>(reinterpret_cast<T*>(smem) + size_t(kWarps) * C::kStages * C::kStageElems) +
                    warp * C::kStages;

  const SplitUnit u(p, chunks, 16);
  const int64_t hkv = u.hkv, b = u.b, h0 = u.h0;
  const int split = u.split, heads = u.heads, begin = u.begin, end = u.end;
  // Steps start on the kKeys grid (keys before `begin` are masked).
  const int step0 = begin / kKeys * kKeys;
  const int steps = end > begin ? (end - step0 + kKeys - 1) / kKeys : 0;
  const int my_steps = steps > warp ? (steps - warp + kWarps - 1) / kWarps : 0;  // steps warp, warp + 4, ...

  const T* gK = reinterpret_cast<const T*>(p.k) + hkv * p.k_head;
  const T* gV = reinterpret_cast<const T*>(p.v) + hkv * p.v_head;
  const int block_size = int(p.block_size);
  const int32_t* table = p.table ? p.table + b * p.table_batch : nullptr;
  const bool one_block_a_step = table == nullptr || block_size % kKeys == 0;
  auto first_key = [&](int it) { return step0 + (it * kWarps + warp) * kKeys; };

  // Lane x < kKeys: the block of key x of the next step to issue.
  int32_t entry = 0;
  auto fetch_entry = [&](int it) {
    const int j = first_key(it) + lane;
    entry = table && lane < kKeys && j < end ? __ldg(table + int64_t(j / block_size) * p.table_col) : int32_t(b);
  };
  const int c = lane % C::kRowChunks, lane_row = lane / C::kRowChunks;
  const int64_t k_copy_step = int64_t(C::kRowsPerCopy) * p.k_row, v_copy_step = int64_t(C::kRowsPerCopy) * p.v_row;
  auto issue = [&](int it) {
    const int st = it % C::kStages, j0 = first_key(it);
    const int jx = j0 + lane;
    const bool ok_x = lane < kKeys && jx >= begin && jx < end && entry >= 0 && entry < p.num_blocks;
    const uint32_t valid = __ballot_sync(0xFFFFFFFFu, ok_x);
    if (lane == 0) masks[st] = valid;
    T* sk = ring + st * C::kStageElems;
    T* sv = sk + kKeys * kDim;
    if (one_block_a_step) {
      const int64_t blk = __shfl_sync(0xFFFFFFFFu, entry, 0);
      const int64_t r = (table ? j0 % block_size : j0) + lane_row;
      const T* k_row = gK + blk * p.k_block + r * p.k_row + c * 8;
      const T* v_row = gV + blk * p.v_block + r * p.v_row + c * 8;
#pragma unroll
      for (int i = 0; i < C::kCopies; ++i) {
        const int row = i * C::kRowsPerCopy + lane_row;
        const bool ok = (valid >> row) & 1u;
        cp_async_16(sk + swizzled<kDim>(row, c), ok ? k_row + i * k_copy_step : gK, ok);
        cp_async_16(sv + swizzled<kDim>(row, c), ok ? v_row + i * v_copy_step : gV, ok);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < C::kCopies; ++i) {
      const int row = i * C::kRowsPerCopy + lane_row;
      const int64_t blk = __shfl_sync(0xFFFFFFFFu, entry, row);
      const bool ok = (valid >> row) & 1u;
      const int r = (j0 + row) % block_size;
      const int64_t off_k = ok ? blk * p.k_block + int64_t(r) * p.k_row + c * 8 : 0;
      const int64_t off_v = ok ? blk * p.v_block + int64_t(r) * p.v_row + c * 8 : 0;
      cp_async_16(sk + swizzled<kDim>(row, c), gK + off_k, ok);
      cp_async_16(sv + swizzled<kDim>(row, c), gV + off_v, ok);
    }
  };

  constexpr float kLog2e = 1.4426950408889634f;
  const float scale = float(p.scale), softcap = float(p.softcap), scale_log2 = float(p.scale * 1.4426950408889634);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kDimTiles][4] = {};

  if (my_steps > 0) fetch_entry(0);
#pragma unroll
  for (int it = 0; it < C::kStages - 1; ++it) {
    if (it < my_steps) {
      issue(it);
      if (it + 1 < my_steps) fetch_entry(it + 1);
    }
    cp_async_commit();
  }
  allow_dependent_launch();
  // Q as A fragments, loaded while the first stages stream in: rows grp and
  // grp + 8 (query heads), columns 2 quad (+8).
  const T* gQ = reinterpret_cast<const T*>(p.q) + b * p.q_batch + h0 * p.q_head;
  uint32_t qf[kDim / 16][4];
  {
    auto q_at = [&](int row, int d) {
      return row < heads ? float(convert<float>(gQ[row * p.q_head + d * p.q_dim])) : 0.f;
    };
#pragma unroll
    for (int kd = 0; kd < kDim / 16; ++kd)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int row = grp + 8 * (f & 1), d = kd * 16 + 2 * quad + 8 * (f >> 1);
        qf[kd][f] = pack2<T>(q_at(row, d), q_at(row, d + 1));
      }
  }

  for (int it = 0; it < my_steps; ++it) {
    const int st = it % C::kStages;
    const int next = it + C::kStages - 1;  // its stage is the one read at it - 1
    if (next < my_steps) {
      issue(next);
      if (next + 1 < my_steps) fetch_entry(next + 1);
    }
    cp_async_commit();
    cp_async_wait<C::kStages - 1>();
    __syncwarp();
    const T* sk = ring + st * C::kStageElems;
    const T* sv = sk + kKeys * kDim;
    const uint32_t valid = masks[st];

    float s[kKeyTiles][4] = {};
#pragma unroll
    for (int np = 0; np < kKeyTiles / 2; ++np)
#pragma unroll
      for (int kd = 0; kd < kDim / 16; ++kd) {
        uint32_t bf[4];
        const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(bf, sk + swizzled<kDim>(row, kd * 2 + ((lane >> 3) & 1)));
        mma_16x8x16<T>(s[2 * np], qf[kd], bf[0], bf[1]);
        mma_16x8x16<T>(s[2 * np + 1], qf[kd], bf[2], bf[3]);
      }
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (softcap > 0.f) {  // the branch outside the loop: one test a step
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = softcap * tanhf(s[nt][e] * scale / softcap) * kLog2e;
    } else {
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = nt * 8 + 2 * quad + (e & 1);
        if (!((valid >> key) & 1u)) s[nt][e] = -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
      }
    float corr[2], m_ref[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      corr[r] = m_new == -INFINITY ? 1.f : fast_exp2(m[r] - m_new);
      m_ref[r] = m_new == -INFINITY ? 0.f : m_new;
      m[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] - m_ref[e / 2]);
        sum[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];  // quad-partial; reduced at the end
    // Once the running maxima settle, most steps leave every factor at 1:
    // skipping the multiply by 1 changes no bit.
    if (__any_sync(0xFFFFFFFFu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] *= corr[0], o[dt][1] *= corr[0], o[dt][2] *= corr[1], o[dt][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDim / 16; ++dp) {
        uint32_t bf[4];
        const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(bf, sv + swizzled<kDim>(row, dp * 2 + (lane >> 4)));
        mma_16x8x16<T>(o[2 * dp], a, bf[0], bf[1]);
        mma_16x8x16<T>(o[2 * dp + 1], a, bf[2], bf[3]);
      }
    }
    __syncwarp();  // the stage is refilled by the next issue
  }
  cp_async_wait<0>();
  __syncthreads();  // the rings become the merge buffers

  float* red = reinterpret_cast<float*>(smem);  // [kWarps][16][kDim]
  float* wm = red + kWarps * 16 * kDim;         // [kWarps][16]
  float* wl = wm + kWarps * 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float x = l[r];
    x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
    x += __shfl_xor_sync(0xFFFFFFFFu, x, 2);
    const int row = grp + 8 * r;
    if (quad == 0) wm[warp * 16 + row] = m[r], wl[warp * 16 + row] = x;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      float* dst = red + (warp * 16 + row) * kDim + dt * 8 + 2 * quad;
      dst[0] = o[dt][2 * r], dst[1] = o[dt][2 * r + 1];
    }
  }
  __syncthreads();

  const int64_t splits = p.splits;
  for (int g = warp; g < heads; g += kWarps) {  // a warp per query head
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, wm[w * 16 + g]);
    float weight[kWarps], l_all = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = wm[w * 16 + g];
      weight[w] = mw == -INFINITY ? 0.f : fast_exp2(mw - top);
      l_all += weight[w] * wl[w * 16 + g];
    }
    const float inv = l_all > 0.f ? 1.f / l_all : 0.f;
    const int64_t h = h0 + g, row = b * p.heads_q + h;
    for (int d = lane; d < kDim; d += 32) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += weight[w] * red[(w * 16 + g) * kDim + d];
      total *= inv;
      if (splits == 1) reinterpret_cast<T*>(p.out)[b * p.out_batch + h * p.out_head + d * p.out_dim] = convert<T>(total);
      else static_cast<float*>(p.workspace)[(row * splits + split) * p.value_dim + d] = total;
    }
    if (lane == 0) {
      const float lse = row_lse(top, l_all);
      if (splits == 1) reinterpret_cast<float*>(p.lse)[b * p.lse_batch + h * p.lse_head] = lse;
      else static_cast<float*>(p.workspace)[p.batch * p.heads_q * splits * p.value_dim + row * splits + split] = lse;
    }
  }
}

/// Launches `kernel` with programmatic stream serialization on sm_90+: it may
/// start while the previous kernel in the stream drains and must call
/// wait_for_prerequisite_grid before touching memory that kernel may write.
template <class... Params, class... Args>
Status launch_overlapped(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, CUstream_st* stream,
                         Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = overlap;
  config.numAttrs = current_sm_version() >= 90 ? 1 : 0;
  BARACUDA_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  return Status::ok();
}

template <class T, int kDim>
Status launch_split_tc(const DecodeProblem& p, CUstream_st* stream) {
  constexpr size_t smem = TcCfg<kDim>::kSmem;
  const int64_t chunks = (p.group() + 15) / 16, units = p.batch * p.heads_kv * chunks;
  if (units > INT32_MAX) return unsupported("decode_attention: ", units, " (sequence, kv head) pairs exceed one launch");
  BARACUDA_TRY(allow_smem(decode_split_tc<T, kDim>, smem));
  return launch_overlapped(decode_split_tc<T, kDim>, dim3(unsigned(units), unsigned(p.splits)), kThreads, smem, stream, p,
                           int(chunks));
}

/// Merges the splits of one (b, h) row: out = sum_s w_s out_s / sum_s w_s
/// with w_s = exp(lse_s - max lse). It runs on the critical path after the
/// split kernel, so its loads go out in as few rounds as possible: warp w
/// takes splits [kSplitsAWarp w, kSplitsAWarp (w + 1)) of each round of
/// kCombineWarps kSplitsAWarp splits, a lane dims lane, lane + 32, ..., and
/// the first round's partials are in flight while the weights are formed.
/// A warp sums its splits in round order, then the warps' sums are added in
/// warp order: the order is fixed, the result bitwise reproducible.
constexpr int kCombineThreads = 256, kCombineWarps = kCombineThreads / 32, kSplitsAWarp = 4;

template <class T>
__global__ void __launch_bounds__(kCombineThreads) decode_combine(const DecodeProblem p) {
  using M = math_t<T, false>;
  using LseT = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr int kDims = 256 / 32;  // dims a lane holds (value_dim <= 256)
  constexpr int kRound = kCombineWarps * kSplitsAWarp;
  __shared__ M weight[kMaxSplits];
  __shared__ M warp_sum_of[kCombineWarps][256];
  wait_for_prerequisite_grid();
  // The split grid is done, so the next kernel (the next call's split
  // kernel) takes only free slots while these CTAs finish.
  allow_dependent_launch();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x, b = row / p.heads_q, h = row % p.heads_q;
  const int splits = p.splits, dims = int(p.value_dim);
  const M* part = static_cast<const M*>(p.workspace) + row * splits * p.value_dim;
  const M* lse = static_cast<const M*>(p.workspace) + p.batch * p.heads_q * splits * p.value_dim + row * splits;
  M v[kSplitsAWarp][kDims];
  auto load_round = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kSplitsAWarp; ++i) {
      const int s = s0 + warp * kSplitsAWarp + i;
#pragma unroll
      for (int k = 0; k < kDims; ++k)
        v[i][k] = s < splits && lane + 32 * k < dims ? part[int64_t(s) * dims + lane + 32 * k] : M(0);
    }
  };
  load_round(0);
  // The splits' lse in shared memory once, then weights relative to the largest.
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) weight[s] = lse[s];
  __syncthreads();
  M top = neg_inf<M>();
  for (int s = 0; s < splits; ++s) top = m_max(top, weight[s]);
  __syncthreads();
  for (int s = threadIdx.x; s < splits; s += kCombineThreads)
    weight[s] = top == neg_inf<M>() ? M(0) : m_exp(weight[s] - top);
  __syncthreads();
  M acc[kDims] = {};
  for (int s0 = 0; s0 < splits; s0 += kRound) {
    if (s0 > 0) load_round(s0);
#pragma unroll
    for (int i = 0; i < kSplitsAWarp; ++i) {
      const int s = s0 + warp * kSplitsAWarp + i;
      const M w = s < splits ? weight[s] : M(0);
#pragma unroll
      for (int k = 0; k < kDims; ++k) acc[k] += w * v[i][k];
    }
  }
#pragma unroll
  for (int k = 0; k < kDims; ++k)
    if (lane + 32 * k < dims) warp_sum_of[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  M sum = M(0);
  for (int s = 0; s < splits; ++s) sum += weight[s];
  const M inv = sum > M(0) ? M(1) / sum : M(0);
  for (int d = threadIdx.x; d < dims; d += kCombineThreads) {
    M total = M(0);
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) total += warp_sum_of[w][d];
    reinterpret_cast<T*>(p.out)[b * p.out_batch + h * p.out_head + d * p.out_dim] = convert<T>(total * inv);
  }
  if (threadIdx.x == 0)
    reinterpret_cast<LseT*>(p.lse)[b * p.lse_batch + h * p.lse_head] =
        LseT(sum > M(0) ? top + m_log(sum) : neg_inf<M>());
}

/// Whether K and V can be copied in 16-byte chunks along the head dim.
template <class T>
bool vector_friendly(const DecodeProblem& p, int dim) {
  if (!kHalfType<T> || p.head_dim != dim || p.value_dim != dim || p.k_dim != 1 || p.v_dim != 1) return false;
  constexpr int64_t kElems = 16 / sizeof(T);
  auto aligned = [&](const char* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto step = [&](int64_t stride, int64_t size) { return size <= 1 || stride % kElems == 0; };
  return aligned(p.k) && aligned(p.v) && step(p.k_block, p.num_blocks) && step(p.k_row, p.block_size) &&
         step(p.k_head, p.heads_kv) && step(p.v_block, p.num_blocks) && step(p.v_row, p.block_size) &&
         step(p.v_head, p.heads_kv);
}

template <class T, int kDim, int kG, bool kVec>
Status launch_split(const DecodeProblem& p, CUstream_st* stream) {
  const int64_t chunks = (p.group() + kG - 1) / kG, units = p.batch * p.heads_kv * chunks;
  if (units > INT32_MAX) return unsupported("decode_attention: ", units, " (sequence, kv head) pairs exceed one launch");
  decode_split<T, kDim, kG, kVec><<<dim3(unsigned(units), unsigned(p.splits)), kThreads, 0, stream>>>(p, int(chunks));
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <int kDim, class F>
Status with_dim(int dim, F&& f) {
  if (dim == kDim) return f(std::integral_constant<int, kDim>{});
  if constexpr (kDim < 256) return with_dim<kDim * 2>(dim, f);
  else return internal_error("decode_attention: head dim tile ", dim);
}

template <class T>
struct CudaDecode {
  static Status run(const DecodeProblem& p, CUstream_st* stream) {
    if (p.batch == 0 || p.heads_q == 0) return Status::ok();
    if (p.splits < 1 || p.splits > kMaxSplits || p.capacity() > kDecodeMaxCapacity || p.head_dim > 256 || p.value_dim > 256)
      return internal_error("decode_attention: the plan let through splits ", p.splits, ", capacity ", p.capacity(),
                            ", head dims ", p.head_dim, "/", p.value_dim);
    const int64_t widest = p.head_dim > p.value_dim ? p.head_dim : p.value_dim;
    const int dim = widest <= 64 ? 64 : widest <= 128 ? 128 : 256;
    const int64_t group = p.group();
    const bool fast = vector_friendly<T>(p, dim);
    BARACUDA_TRY(with_dim<64>(dim, [&]<int kDim>(std::integral_constant<int, kDim>) -> Status {
      if constexpr (kHalfType<T>) {
        if constexpr (kDim <= 128)
          if (fast && current_sm_version() >= 80) return launch_split_tc<T, kDim>(p, stream);
        if (fast && group == 1) return launch_split<T, kDim, 1, true>(p, stream);
        if (fast && group <= 4) return launch_split<T, kDim, 4, true>(p, stream);
        if (fast) return launch_split<T, kDim, 8, true>(p, stream);
      }
      return launch_split<T, kDim, 4, false>(p, stream);
    }));
    if (p.splits > 1) {
      if (p.batch * p.heads_q > INT32_MAX)
        return unsupported("decode_attention: ", p.batch * p.heads_q, " (sequence, head) rows exceed one launch");
      return launch_overlapped(decode_combine<T>, dim3(unsigned(p.batch * p.heads_q)), kCombineThreads, 0, stream, p);
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<FloatTypes, CudaDecode>(cuda_decode(), "decode_attention");

/// Before cuDNN's SDPA serves a decode problem (Note [Decode on cuDNN] in
/// decode.cpp): one thread a sequence writes its padding-mask lengths (the
/// cached tokens clamped to the capacity, one query when any); the CTA of an
/// empty sequence then gives its rows out = 0 and lse = -inf, which cuDNN
/// leaves alone. Registered as "decode_padding_lengths:dtype" (decode.hpp).
template <class T>
__global__ void __launch_bounds__(kThreads) decode_padding_lengths_kernel(const DecodeProblem p, int32_t* len_q,
                                                                          int32_t* len_kv) {
  wait_for_prerequisite_grid();  // launched overlapped: seq_lens may come from the previous kernel
  __shared__ int32_t lens[kThreads];
  const int64_t first = int64_t(blockIdx.x) * kThreads, b = first + threadIdx.x;
  const int64_t cap = p.capacity();
  int32_t len = 0;
  if (b < p.batch) {
    const int64_t asked = p.seq_lens[b * p.seq_lens_stride];
    len = int32_t(asked < 0 ? 0 : asked > cap ? cap : asked);
    len_kv[b] = len;
    len_q[b] = len > 0 ? 1 : 0;
  }
  lens[threadIdx.x] = b < p.batch ? len : 1;
  __syncthreads();
  using LseT = float;  // halves only
  for (int i = 0; i < kThreads && first + i < p.batch; ++i) {
    if (lens[i] != 0) continue;
    const int64_t seq = first + i;
    for (int64_t e = threadIdx.x; e < p.heads_q * p.value_dim; e += kThreads) {
      const int64_t h = e / p.value_dim, d = e % p.value_dim;
      reinterpret_cast<T*>(p.out)[seq * p.out_batch + h * p.out_head + d * p.out_dim] = convert<T>(0.f);
    }
    for (int64_t h = threadIdx.x; h < p.heads_q; h += kThreads)
      reinterpret_cast<LseT*>(p.lse)[seq * p.lse_batch + h * p.lse_head] = -INFINITY;
  }
}

template <class T>
struct PaddingLengths {
  static Status run(const DecodeProblem& p, CUstream_st* stream) {
    if (p.batch == 0) return Status::ok();
    const int64_t blocks = (p.batch + kThreads - 1) / kThreads;
    if (blocks > INT32_MAX) return unsupported("decode_attention: ", p.batch, " sequences exceed one launch");
    int32_t* len_q = static_cast<int32_t*>(p.workspace);
    return launch_overlapped(decode_padding_lengths_kernel<T>, dim3(unsigned(blocks)), kThreads, 0, stream, p, len_q,
                             len_q + p.batch);
  }
};

[[maybe_unused]] const bool padding_registered =
    register_launchers<TypeList<__half, __nv_bfloat16>, PaddingLengths>(cuda_decode(), "decode_padding_lengths");

/// CTAs of decode_split_tc<kDim> an SM of the current device holds, by the
/// occupancy API (registers and its 96 KiB of shared memory); 0 if unknown.
template <int kDim>
int tc_resident_ctas() {
  const auto kernel = decode_split_tc<__nv_bfloat16, kDim>;
  if (!allow_smem(kernel, TcCfg<kDim>::kSmem).is_ok()) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks_per_sm(kernel, kThreads, TcCfg<kDim>::kSmem);
}

}  // namespace

int decode_tc_resident_ctas(int64_t head_dim) {
  if (head_dim == 64) return once_per_device([](int) { return tc_resident_ctas<64>(); });
  if (head_dim == 128) return once_per_device([](int) { return tc_resident_ctas<128>(); });
  return 0;
}

}  // namespace baracuda::attn
