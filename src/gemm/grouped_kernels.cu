// The bespoke CUDA grouped GEMM. The launch shape depends only on sizes the
// host knows; each CTA reads the offsets on the device (graph-capturable):
// - mode rows: a CTA per (row tile of all of a's rows, column tile); it finds
//   the first group ending past its first row by binary search in offs and
//   computes every group segment its rows meet (one at MoE sizes), then
//   writes zeros over its rows past offs[G-1].
// - modes batch and red: a CTA per (row tile, column tile, group); mode red
//   reads its K range [offs[g-1], offs[g]) (empty: zeros).
// f16/bf16 on sm_80+: 128 x 128 x 32 tiles on tensor cores (mma.sync
// m16n8k16, f32 accumulators), 8 warps of 64 x 32, four shared stages filled
// by cp.async when an operand has a unit stride along K or along M/N and
// 16-byte aligned rows, by plain loads otherwise (Note [Tensor-core
// mainloop]). f32, f64 (and halves
// before sm_80): 64 x 64 x 16 tiles on CUDA cores. Sums run in a fixed
// order: deterministic.
//
// Note [Offsets on the device]
// The host reference rejects decreasing offsets and offsets past the split
// extent. The kernels cannot report an error without a sync, so they clamp
// every offset into [0, extent] and never read or write outside the
// operands: with non-decreasing offsets past the extent, the last groups
// end at the extent; with decreasing offsets, rows (mode rows) may be left
// unwritten or written by more than one group, and mode red treats a group
// whose end is before its start as empty.
#include "attention/device.cuh"
#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "gemm/epilogue.hpp"
#include "gemm/grouped.hpp"
#include "gemm/tiled.cuh"

namespace baracuda::gemm {

namespace {

/// offs[g] clamped into [0, extent]; offs[-1] = 0.
__device__ __forceinline__ int64_t group_end(const GroupedProblem& p, int64_t g) { return p.end_of(g); }

/// One product a CTA computes: rows [m_lo, m_hi) of its tile rows, K range
/// [k_lo, k_hi), with the group's operand bases.
struct Segment {
  int64_t m_lo, m_hi, k_lo, k_hi;
  int64_t group;
};

/// Calls body(segment) for every segment of the CTA at (tile rows [m0, m0 +
/// kTileM), group blockIdx.z), then zero-fills its rows past the last group
/// (mode rows): body(segment with an empty K range) writes zeros.
template <int kTileM, class Body>
__device__ void for_each_segment(const GroupedProblem& p, int64_t m0, Body&& body) {
  const int64_t m_end = min(m0 + kTileM, p.m);
  if (p.only && p.mode != GroupedMode::rows && !p.only[blockIdx.z]) return;  // another kernel's group
  if (p.mode == GroupedMode::batch) {
    body(Segment{m0, m_end, 0, p.k, int64_t(blockIdx.z)});
    return;
  }
  if (p.mode == GroupedMode::red) {
    const int64_t g = blockIdx.z, lo = group_end(p, g - 1), hi = group_end(p, g);
    body(Segment{m0, m_end, lo, hi > lo ? hi : lo, g});
    return;
  }
  // Mode rows: the first group g whose end is past m0 (offs sorted).
  int64_t lo = 0, hi = p.groups;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (group_end(p, mid) <= m0) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t g = lo; g < p.groups; ++g) {
    const int64_t start = group_end(p, g - 1);
    if (start >= m_end) break;
    const int64_t s = max(start, m0), e = min(group_end(p, g), m_end);
    if (e > s && (!p.only || p.only[g])) body(Segment{s, e, 0, p.k, g});
  }
  const int64_t tail = max(p.groups ? group_end(p, p.groups - 1) : int64_t(0), m0);
  if (tail < m_end) body(Segment{tail, m_end, 0, 0, 0});
}

// ---------------------------------------------------------------- CUDA cores

// The dense kernel's tiles and sums (gemm/tiled.cuh), over a segment's K range.
using tiled::kThreads, tiled::kTileK, tiled::kTileM, tiled::kTileN, tiled::kPerThread;

template <class T>
__global__ void __launch_bounds__(kThreads) grouped_simt(const GroupedProblem p) {
  using Acc = acc_t<T, false>;
  __shared__ Acc sA[kTileK][kTileM + 1];  // [k][m]
  __shared__ Acc sB[kTileK][kTileN + 1];  // [k][n]
  const int64_t m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for_each_segment<kTileM>(p, m0, [&](const Segment& s) {
    const T* gA = reinterpret_cast<const T*>(p.a.data) + s.group * p.a.group;
    const T* gB = reinterpret_cast<const T*>(p.b.data) + s.group * p.b.group;
    T* gD = reinterpret_cast<T*>(p.d.data) + s.group * p.d.group;
    tiled::TileSums<Acc> sums;
    for (int64_t k0 = s.k_lo; k0 < s.k_hi; k0 += kTileK) {  // K from k_lo: only the k_hi edge is checked
      tiled::load_tile<kTileM, false, T, Acc, scale_t<T>>(sA, gA, m0, k0, p.m, s.k_hi, p.a.row, p.a.col, {});
      tiled::load_tile<kTileN, false, T, Acc, scale_t<T>>(sB, gB, n0, k0, p.n, s.k_hi, p.b.col, p.b.row, {});
      __syncthreads();
      sums.add(sA, sB, tx, ty);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t m = m0 + ty + 16 * i;
      if (m < s.m_lo || m >= s.m_hi) continue;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n < p.n) gD[m * p.d.row + n * p.d.col] = convert<T>(sums.total(i, j));
      }
    }
  });
}

// ---------------------------------------------------------------- tensor cores

// Note [Tensor-core mainloop]
// A CTA of 8 warps computes a 128 x 128 tile of D; warp w owns rows
// 64 (w / 4) and columns 32 (w % 4) of it: 4 x 4 mma.sync m16n8k16 tiles, 64
// f32 accumulators a thread. K walks in steps of 32 through kTcStages shared
// stages (dynamic shared memory) filled by 16-byte cp.async (zero-filled past
// the operands' edges), one __syncthreads a step:
//   wait until tile t landed (wait_group<kTcStages - 2>); __syncthreads;
//   issue tile t + kTcStages - 1 into the stage tile t - 1 used; commit;
//   math on tile t: per k16 step, 6 ldmatrix.x4 (4 of A, 2 of B), 16 mma.
// The barrier of step t also tells every warp's reads of tile t - 1 are done,
// so its stage may be refilled. Each operand stage is stored as it lies in
// memory: K-contiguous [rows][32 + 8] or rows-contiguous [32][rows + 8]. The
// 8-element pad puts the 8 row addresses of an ldmatrix (row strides of 80
// and 272 bytes) in 8 distinct 4-bank groups: conflict-free, as an XOR
// swizzle would be, with plain row-major addressing. Operands without a unit
// stride or 16-byte rows take element loads (stored straight to shared) on
// the same schedule. When both operands take cp.async the kernel is built for
// two CTAs an SM (128 registers, 2 x 80 KiB of shared memory, the carveout
// set to the most shared memory; ptxas spills 32 to 136 bytes, each value
// stored and reloaded about once), else for one (the element loads need
// registers). Fragments are not double-buffered across the k16 steps: that
// would not fit 128 registers, and the 16 warps of an SM hide the ldmatrix
// latency instead.

constexpr int kTcM = 128, kTcN = 128, kTcK = 32, kTcWarps = 8, kTcThreads = 32 * kTcWarps, kTcStages = 4;
constexpr int kPad = 8;  // b16 elements added to each shared row: ldmatrix rows fall in distinct banks
constexpr int kTcVecCtas = 2;  // CTAs an SM the all-cp.async kernel is built for (1: ~220 registers, no spills)

/// Shared elements of one stage of an operand tile of kRows (M or N) x kTcK,
/// stored K-contiguous ([rows][K + pad]) or rows-contiguous ([K][rows + pad]).
template <int kRows, bool kKMajor>
constexpr int tile_elems() {
  return kKMajor ? kRows * (kTcK + kPad) : kTcK * (kRows + kPad);
}

template <class T>
constexpr size_t tc_smem_bytes(bool a_k_major, bool b_k_major) {
  const int a = a_k_major ? tile_elems<kTcM, true>() : tile_elems<kTcM, false>();
  const int b = b_k_major ? tile_elems<kTcN, true>() : tile_elems<kTcN, false>();
  return size_t(kTcStages) * (a + b) * sizeof(T);
}

/// The 16-byte cp.async loads of one operand in a segment (unit stride along
/// the tile's contiguous dim, 16-byte aligned rows). A thread moves chunks
/// e = threadIdx.x + q * kTcThreads of each tile (8 elements along the
/// contiguous dim): their shared offsets are fixed, their global addresses
/// advance by kTcK along K a tile, and only the K edge is checked per tile.
template <int kRows, bool kKMajor, class T>
struct VectorLoader {
  static constexpr int kChunks = kRows * kTcK / 8 / kTcThreads;
  static_assert(kChunks * 8 * kTcThreads == kRows * kTcK, "whole chunks per thread");
  static constexpr int kChunksK = kTcK / 8, kChunksR = kRows / 8;

  static_assert(kKMajor || kTcThreads % kChunksR == 0, "rows-contiguous: a thread's chunks share their rows");

  const T* src[kChunks];  ///< the chunks of the next tile to issue
  int rows_in;            ///< K-major: bit q set when chunk q's row is inside; else elements inside along rows (0..8)
  int64_t step;           ///< kTcK elements along K

  /// Tile row and K index of this thread's chunk q.
  __device__ __forceinline__ static int chunk_row(int q) {
    const int e = threadIdx.x + q * kTcThreads;
    return kKMajor ? e / kChunksK : (e % kChunksR) * 8;
  }
  __device__ __forceinline__ static int chunk_k(int q) {
    const int e = threadIdx.x + q * kTcThreads;
    return kKMajor ? (e % kChunksK) * 8 : e / kChunksR;
  }
  __device__ __forceinline__ static int shared_offset(int q) {
    return kKMajor ? chunk_row(q) * (kTcK + kPad) + chunk_k(q) : chunk_k(q) * (kRows + kPad) + chunk_row(q);
  }

  /// The loads of the tiles at K = k_begin, k_begin + kTcK, ... of rows [row0, row0 + kRows).
  __device__ __forceinline__ VectorLoader(const T* base, int64_t row_stride, int64_t k_stride, int64_t rows,
                                          int64_t row0, int64_t k_begin) {
    step = kTcK * k_stride;
    rows_in = 0;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int64_t gr = row0 + chunk_row(q), left = rows - gr;
      if (kKMajor) rows_in |= left > 0 ? 1 << q : 0;
      else rows_in = left <= 0 ? 0 : left < 8 ? int(left) : 8;
      src[q] = base + gr * row_stride + (k_begin + chunk_k(q)) * k_stride;  // read only while inside
    }
  }

  /// Issues the next tile into stage `s` and moves on by kTcK: `k_left` (at
  /// most kTcK) elements of K are inside from the tile's first; the rest of
  /// the tile is zero-filled (partial chunks: the bytes inside only). A chunk
  /// with nothing inside reads from `any` (a valid address; no byte is read).
  __device__ __forceinline__ void issue(T* s, int k_left, const void* any) {
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int k = chunk_k(q);
      int n = kKMajor ? min(k_left - k, 8) : rows_in;  // elements of the chunk inside
      if (kKMajor ? (rows_in >> q & 1) == 0 : k >= k_left) n = 0;
      const int bytes = n > 0 ? n * int(sizeof(T)) : 0;
      T* dst = s + shared_offset(q);
      const T* from = bytes > 0 ? src[q] : static_cast<const T*>(any);
      cp_async_16_zfill(dst, from, bytes);
      src[q] += step;
    }
  }
};

/// Element loads of the tile at (row0, k0) of an operand with any strides,
/// stored straight to shared; 0 outside [0, rows) x [0, ks).
template <int kRows, bool kKMajor, class T>
__device__ __forceinline__ void load_elements(T* s, const T* base, int64_t row_stride, int64_t k_stride, int64_t rows,
                                              int64_t ks, int64_t row0, int64_t k0) {
  // Consecutive threads walk the operand's smaller stride.
  const bool rows_fast = (row_stride < 0 ? -row_stride : row_stride) <= (k_stride < 0 ? -k_stride : k_stride);
  for (int e = threadIdx.x; e < kRows * kTcK; e += kTcThreads) {
    const int r = rows_fast ? e % kRows : e / kTcK, k = rows_fast ? e / kRows : e % kTcK;
    const int64_t gr = row0 + r, gk = k0 + k;
    const T v = gr < rows && gk < ks ? base[gr * row_stride + gk * k_stride] : T(0.f);
    (kKMajor ? s[r * (kTcK + kPad) + k] : s[k * (kRows + kPad) + r]) = v;
  }
}

/// Zeroes the tile's K columns outside [k_lo, k_hi) (mode red's group edges).
template <int kRows, bool kKMajor, class T>
__device__ __forceinline__ void mask_k(T* s, int64_t k0, int64_t k_lo, int64_t k_hi) {
  for (int e = threadIdx.x; e < kRows * kTcK; e += kTcThreads) {
    const int r = e / kTcK, k = e % kTcK;
    const int64_t gk = k0 + k;
    if (gk < k_lo || gk >= k_hi) (kKMajor ? s[r * (kTcK + kPad) + k] : s[k * (kRows + kPad) + r]) = T(0.f);
  }
}

/// The A (16 x 16 at rows wm + 16 mt) and B (16 x 16 at columns wn + 16 np)
/// fragments of k16 step kk of a stage.
template <class T, bool kAK, bool kBK>
__device__ __forceinline__ void load_fragments(uint32_t (&af)[4][4], uint32_t (&bf)[2][4], const T* tA, const T* tB,
                                               int wm, int wn, int kk, int lane) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    const int r = wm + mt * 16;
    if constexpr (kAK)
      attn::ldmatrix_x4(af[mt], tA + (r + lane % 16) * (kTcK + kPad) + kk + (lane / 16) * 8);
    else
      attn::ldmatrix_x4_trans(af[mt], tA + (kk + (lane & 7) + (lane >> 4) * 8) * (kTcM + kPad) + r + ((lane >> 3) & 1) * 8);
  }
#pragma unroll
  for (int np = 0; np < 2; ++np) {
    const int c = wn + np * 16;
    if constexpr (kBK)
      attn::ldmatrix_x4(bf[np], tB + (c + (lane & 7) + ((lane >> 4) << 3)) * (kTcK + kPad) + kk + ((lane >> 3) & 1) * 8);
    else
      attn::ldmatrix_x4_trans(bf[np], tB + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * (kTcN + kPad) + c + (lane >> 4) * 8);
  }
}

/// kVec: both operands take VectorLoader (two CTAs an SM); otherwise a_vector
/// and b_vector choose per operand (one CTA an SM: the element loads cost registers).
template <class T, bool kAK, bool kBK, bool kVec>
__global__ void __launch_bounds__(kTcThreads, kVec ? kTcVecCtas : 1)
    grouped_tc(const GroupedProblem p, bool a_vector, bool b_vector) {
  constexpr int kTileA = tile_elems<kTcM, kAK>(), kTileB = tile_elems<kTcN, kBK>();
  extern __shared__ __align__(16) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);
  // Stage s: sA(s) [M][K + pad] or [K][M + pad], sB(s) [N][K + pad] or [K][N + pad] (computed, not an
  // array of pointers indexed at run time: that would live in local memory).
  auto sA = [&](int stage) { return smem + stage * kTileA; };
  auto sB = [&](int stage) { return smem + kTcStages * kTileA + stage * kTileB; };
  const int64_t m0 = int64_t(blockIdx.y) * kTcM, n0 = int64_t(blockIdx.x) * kTcN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // this warp's 64 x 32 of the tile
  for_each_segment<kTcM>(p, m0, [&](const Segment& s) {
    const T* gA = reinterpret_cast<const T*>(p.a.data) + s.group * p.a.group;
    const T* gB = reinterpret_cast<const T*>(p.b.data) + s.group * p.b.group;
    float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
    const int64_t k_begin = s.k_lo / kTcK * kTcK;
    const int tiles = s.k_hi > s.k_lo ? int((s.k_hi - k_begin + kTcK - 1) / kTcK) : 0;
    VectorLoader<kTcM, kAK, T> va(gA, p.a.row, p.a.col, p.m, m0, k_begin);
    VectorLoader<kTcN, kBK, T> vb(gB, p.b.col, p.b.row, p.n, n0, k_begin);
    // Tile t (issued in order t = 0, 1, ... while t < tiles) into `stage`.
    auto issue = [&](int stage, int t) {
      const int64_t k0 = k_begin + int64_t(t) * kTcK, left = p.k - k0;
      const int k_left = left < kTcK ? int(left) : kTcK;
      if (kVec || a_vector) va.issue(sA(stage), k_left, p.a.data);
      else load_elements<kTcM, kAK>(sA(stage), gA, p.a.row, p.a.col, p.m, p.k, m0, k0);
      if (kVec || b_vector) vb.issue(sB(stage), k_left, p.b.data);
      else load_elements<kTcN, kBK>(sB(stage), gB, p.b.col, p.b.row, p.n, p.k, n0, k0);
    };
#pragma unroll
    for (int t = 0; t < kTcStages - 1; ++t) {
      if (t < tiles) issue(t, t);
      cp_async_commit();
    }
    int stage = 0;                  // tile t's stage: t % kTcStages
    int next_stage = kTcStages - 1;  // tile t + kTcStages - 1's stage
    for (int t = 0; t < tiles; ++t) {
      cp_async_wait<kTcStages - 2>();  // tile t landed (this thread's copies) ...
      __syncthreads();  // ... every thread's; every warp is done with tile t - 1
      if (t + kTcStages - 1 < tiles) issue(next_stage, t + kTcStages - 1);
      cp_async_commit();
      const int64_t k0 = k_begin + int64_t(t) * kTcK;
      if (k0 < s.k_lo || k0 + kTcK > s.k_hi) {  // a group edge inside the tile
        mask_k<kTcM, kAK>(sA(stage), k0, s.k_lo, s.k_hi);
        mask_k<kTcN, kBK>(sB(stage), k0, s.k_lo, s.k_hi);
        __syncthreads();
      }
      const T* tA = sA(stage);
      const T* tB = sB(stage);
#pragma unroll
      for (int kstep = 0; kstep < kTcK / 16; ++kstep) {
        uint32_t af[4][4], bf[2][4];
        load_fragments<T, kAK, kBK>(af, bf, tA, tB, wm, wn, 16 * kstep, lane);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            attn::mma_16x8x16<T>(acc[mt][nt], af[mt], bf[nt / 2][2 * (nt % 2)], bf[nt / 2][2 * (nt % 2) + 1]);
      }
      stage = stage + 1 == kTcStages ? 0 : stage + 1;
      next_stage = next_stage + 1 == kTcStages ? 0 : next_stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // the next segment refills the stages this one read
    T* gD = reinterpret_cast<T*>(p.d.data) + s.group * p.d.group;
    const int64_t n_lane = n0 + wn + 2 * (lane % 4);  // this lane's first column
    const bool pairs = p.d.col == 1 && p.d.row % 2 == 0 && reinterpret_cast<uintptr_t>(gD) % 4 == 0;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t m = m0 + wm + mt * 16 + lane / 4 + 8 * half;
        if (m < s.m_lo || m >= s.m_hi) continue;
        T* row = gD + m * p.d.row + n_lane * p.d.col;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t n = n_lane + nt * 8;
          const float lo = acc[mt][nt][2 * half], hi = acc[mt][nt][2 * half + 1];
          if (pairs && n + 1 < p.n) {
            *reinterpret_cast<uint32_t*>(row + nt * 8) = attn::pack2<T>(lo, hi);  // both columns in one store
          } else {
            T* at = row + nt * 8 * p.d.col;
            if (n < p.n) *at = convert<T>(lo);
            if (n + 1 < p.n) at[p.d.col] = convert<T>(hi);
          }
        }
      }
  });
}

// ---------------------------------------------------------------- launch

/// Whether cp.async can fill tiles of an operand: unit stride along the
/// tile's contiguous dim, 16-byte aligned base, other strides multiples of 8.
bool vector_source(const GroupedMat& x, bool k_major, int64_t row_stride, int64_t k_stride) {
  const int64_t unit = k_major ? k_stride : row_stride, other = k_major ? row_stride : k_stride;
  return unit == 1 && other % 8 == 0 && x.group % 8 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

/// The tile layout an operand prefers: K-contiguous unless its rows (M or N) are the unit-stride dim.
bool k_major(int64_t row_stride, int64_t k_stride) {
  const int64_t r = row_stride < 0 ? -row_stride : row_stride, k = k_stride < 0 ? -k_stride : k_stride;
  return !(r == 1 && k != 1) && k <= r;
}

template <class T, bool kAK, bool kBK, bool kVec>
Status launch_tc(const GroupedProblem& p, dim3 grid, bool a_vec, bool b_vec, CUstream_st* stream) {
  constexpr size_t smem = tc_smem_bytes<T>(kAK, kBK);
  BARACUDA_TRY(attn::allow_smem(grouped_tc<T, kAK, kBK, kVec>, smem));
  BARACUDA_CUDA_TRY(cudaFuncSetAttribute(grouped_tc<T, kAK, kBK, kVec>,
                                         cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  grouped_tc<T, kAK, kBK, kVec><<<grid, kTcThreads, smem, stream>>>(p, a_vec, b_vec);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <class T, bool kAK, bool kBK>
Status launch_tc(const GroupedProblem& p, dim3 grid, CUstream_st* stream) {
  const bool a_vec = vector_source(p.a, kAK, p.a.row, p.a.col), b_vec = vector_source(p.b, kBK, p.b.col, p.b.row);
  if (a_vec && b_vec) return launch_tc<T, kAK, kBK, true>(p, grid, true, true, stream);
  return launch_tc<T, kAK, kBK, false>(p, grid, a_vec, b_vec, stream);
}

dim3 grid_of(const GroupedProblem& p, int tile_m, int tile_n) {
  const int64_t z = p.mode == GroupedMode::rows ? 1 : p.groups;
  return dim3(unsigned((p.n + tile_n - 1) / tile_n), unsigned((p.m + tile_m - 1) / tile_m), unsigned(z));
}

template <class T>
struct CudaGrouped {
  static Status run(const GroupedProblem& p, CUstream_st* stream) {
    const bool rows = p.mode == GroupedMode::rows;
    if (p.m == 0 || p.n == 0 || (!rows && p.groups == 0)) return Status::ok();
    if (!rows && p.groups > 65535) return unsupported("grouped_mm: ", p.groups, " groups exceed one launch (65535)");
    if ((p.m + kTileM - 1) / kTileM > 65535)
      return unsupported("grouped_mm: ", p.m, " rows exceed one launch (", 65535 * kTileM, ")");
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      if (current_sm_version() >= 80) {
        const dim3 grid = grid_of(p, kTcM, kTcN);
        const bool ak = k_major(p.a.row, p.a.col), bk = k_major(p.b.col, p.b.row);
        if (ak && bk) return launch_tc<T, true, true>(p, grid, stream);
        if (ak) return launch_tc<T, true, false>(p, grid, stream);
        if (bk) return launch_tc<T, false, true>(p, grid, stream);
        return launch_tc<T, false, false>(p, grid, stream);
      }
    }
    grouped_simt<T><<<grid_of(p, kTileM, kTileN), kThreads, 0, stream>>>(p);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<FloatTypes, CudaGrouped>(cuda_grouped(), "grouped_mm");

}  // namespace
}  // namespace baracuda::gemm
