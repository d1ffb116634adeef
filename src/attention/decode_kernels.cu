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

#include "attention/decode.hpp"
#include "attention/device.cuh"
#include "core/cuda_check.hpp"

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
  int64_t unit = blockIdx.x;
  const int chunk = int(unit % chunks);
  unit /= chunks;
  const int64_t hkv = unit % p.heads_kv, b = unit / p.heads_kv;
  const int split = blockIdx.y;
  const int64_t group = p.group(), g0 = int64_t(chunk) * kG;
  const int heads = int(group - g0 < kG ? group - g0 : kG);  // query heads this CTA serves
  const int64_t h0 = hkv * group + g0;

  // The keys of this split: [begin, end) within [first key, len).
  const int cap = int(p.capacity());
  const int64_t asked = p.seq_lens[b * p.seq_lens_stride];
  const int len = int(asked < 0 ? 0 : asked > cap ? cap : asked);
  const int lo = int(decode_first_key(len, p.window_left));
  const int split0 = int(split * p.split_len);
  const int begin = split0 > lo ? split0 : lo;
  const int end = int(split0 + p.split_len < len ? split0 + p.split_len : len);

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

/// Merges the splits of one (b, h) row in split order: out = sum_s w_s out_s
/// / sum_s w_s with w_s = exp(lse_s - max lse).
template <class T>
__global__ void __launch_bounds__(kThreads) decode_combine(const DecodeProblem p) {
  using M = math_t<T, false>;
  using LseT = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ M weight[kMaxSplits];
  const int64_t row = blockIdx.x, b = row / p.heads_q, h = row % p.heads_q;
  const int splits = p.splits;
  const M* part = static_cast<const M*>(p.workspace) + row * splits * p.value_dim;
  const M* lse = static_cast<const M*>(p.workspace) + p.batch * p.heads_q * splits * p.value_dim + row * splits;
  // The splits' lse in shared memory once (not a serial global read per
  // thread), then weights relative to the largest.
  for (int s = threadIdx.x; s < splits; s += kThreads) weight[s] = lse[s];
  __syncthreads();
  M top = neg_inf<M>();
  for (int s = 0; s < splits; ++s) top = m_max(top, weight[s]);
  __syncthreads();
  for (int s = threadIdx.x; s < splits; s += kThreads)
    weight[s] = top == neg_inf<M>() ? M(0) : m_exp(weight[s] - top);
  __syncthreads();
  M sum = M(0);
  for (int s = 0; s < splits; ++s) sum += weight[s];
  const M inv = sum > M(0) ? M(1) / sum : M(0);
  for (int64_t d = threadIdx.x; d < p.value_dim; d += kThreads) {
    M total = M(0);
#pragma unroll 8  // independent loads in flight; the adds stay in split order
    for (int s = 0; s < splits; ++s) total += weight[s] * part[s * p.value_dim + d];
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
        if (fast && group == 1) return launch_split<T, kDim, 1, true>(p, stream);
        if (fast && group <= 4) return launch_split<T, kDim, 4, true>(p, stream);
        if (fast) return launch_split<T, kDim, 8, true>(p, stream);
      }
      return launch_split<T, kDim, 4, false>(p, stream);
    }));
    if (p.splits > 1) {
      if (p.batch * p.heads_q > INT32_MAX)
        return unsupported("decode_attention: ", p.batch * p.heads_q, " (sequence, head) rows exceed one launch");
      decode_combine<T><<<unsigned(p.batch * p.heads_q), kThreads, 0, stream>>>(p);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<FloatTypes, CudaDecode>(cuda_decode(), "decode_attention");

}  // namespace

}  // namespace baracuda::attn
