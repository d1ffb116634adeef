// The bespoke CUDA grouped GEMM. The launch shape depends only on sizes the
// host knows; each CTA reads the offsets on the device (graph-capturable):
// - mode rows: a CTA per (row tile of all of a's rows, column tile); it finds
//   the first group ending past its first row by binary search in offs and
//   computes every group segment its rows meet (one at MoE sizes), then
//   writes zeros over its rows past offs[G-1].
// - modes batch and red: a CTA per (row tile, column tile, group); mode red
//   reads its K range [offs[g-1], offs[g]) (empty: zeros).
// f16/bf16 on sm_80+: 128 x 128 x 32 tiles on tensor cores (mma.sync
// m16n8k16, f32 accumulators), 8 warps of 64 x 32, two shared stages filled
// by cp.async when an operand has a unit stride along K or along M/N and
// 16-byte aligned rows, by plain loads otherwise. f32, f64 (and halves
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
#include "core/cuda_check.hpp"
#include "gemm/epilogue.hpp"
#include "gemm/grouped.hpp"

namespace baracuda::gemm {

namespace {

using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::mma_16x8x16;
using attn::shared_address;

/// offs[g] clamped into [0, extent]; offs[-1] = 0.
__device__ __forceinline__ int64_t group_end(const GroupedProblem& p, int64_t g) {
  if (g < 0) return 0;
  const int64_t o = p.offs[g * p.offs_stride];
  return o < 0 ? 0 : o > p.split_extent() ? p.split_extent() : o;
}

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
    if (e > s) body(Segment{s, e, 0, p.k, g});
  }
  const int64_t tail = max(p.groups ? group_end(p, p.groups - 1) : int64_t(0), m0);
  if (tail < m_end) body(Segment{tail, m_end, 0, 0, 0});
}

// ---------------------------------------------------------------- CUDA cores

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256;
constexpr int kPerThread = kTileM / 16;  // a 16 x 16 thread grid, 4 x 4 outputs each
constexpr int kFlushTiles = 16;

/// A kRows x kTileK tile (rows along M or N) of `src` into sTile[k][row]:
/// rows [0, rows) and K [k_lo, k_hi) only, 0 elsewhere.
template <int kRows, class T, class Acc>
__device__ void load_tile(Acc (*sTile)[kRows + 1], const T* src, int64_t row0, int64_t k0, int64_t rows, int64_t k_lo,
                          int64_t k_hi, int64_t row_stride, int64_t k_stride) {
  const bool rows_fast = (row_stride < 0 ? -row_stride : row_stride) <= (k_stride < 0 ? -k_stride : k_stride);
#pragma unroll
  for (int q = 0; q < kRows * kTileK / kThreads; ++q) {
    const int e = threadIdx.x + q * kThreads;
    const int r = rows_fast ? e % kRows : e / kTileK;
    const int k = rows_fast ? e / kRows : e % kTileK;
    const int64_t gr = row0 + r, gk = k0 + k;
    sTile[k][r] = gr < rows && gk >= k_lo && gk < k_hi ? convert<Acc>(src[gr * row_stride + gk * k_stride]) : Acc(0);
  }
}

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
    // Two-level sums as the dense kernel: error grows with K / 256 + 256.
    Acc acc[kPerThread][kPerThread] = {}, part[kPerThread][kPerThread] = {};
    int tiles_in_part = 0;
    for (int64_t k0 = s.k_lo; k0 < s.k_hi; k0 += kTileK) {
      load_tile<kTileM>(sA, gA, m0, k0, p.m, s.k_lo, s.k_hi, p.a.row, p.a.col);
      load_tile<kTileN>(sB, gB, n0, k0, p.n, s.k_lo, s.k_hi, p.b.col, p.b.row);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kTileK; ++k) {
        Acc rA[kPerThread], rB[kPerThread];
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) rA[i] = sA[k][ty + 16 * i], rB[i] = sB[k][tx + 16 * i];
#pragma unroll
        for (int i = 0; i < kPerThread; ++i)
#pragma unroll
          for (int j = 0; j < kPerThread; ++j) part[i][j] += rA[i] * rB[j];
      }
      __syncthreads();
      if (++tiles_in_part == kFlushTiles) {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i)
#pragma unroll
          for (int j = 0; j < kPerThread; ++j) acc[i][j] += part[i][j], part[i][j] = Acc(0);
        tiles_in_part = 0;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t m = m0 + ty + 16 * i;
      if (m < s.m_lo || m >= s.m_hi) continue;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n < p.n) gD[m * p.d.row + n * p.d.col] = convert<T>(acc[i][j] + part[i][j]);
      }
    }
  });
}

// ---------------------------------------------------------------- tensor cores

constexpr int kTcM = 128, kTcN = 128, kTcK = 32, kTcWarps = 8, kTcThreads = 32 * kTcWarps;
constexpr int kPad = 8;  // b16 elements added to each shared row: ldmatrix rows fall in distinct banks

/// Shared elements of one stage of an operand tile of kRows (M or N) x kTcK,
/// stored K-contiguous ([rows][K + pad]) or rows-contiguous ([K][rows + pad]).
template <int kRows, bool kKMajor>
constexpr int tile_elems() {
  return kKMajor ? kRows * (kTcK + kPad) : kTcK * (kRows + kPad);
}

/// How the CTA fills an operand tile: 16-byte cp.async chunks along the
/// contiguous dim, or element loads for any strides.
struct TileSource {
  const void* base;             ///< the group's operand
  int64_t row_stride, k_stride; ///< rows: M (A) or N (B)
  int64_t rows, ks;             ///< extents: rows and K of the operand
  bool vector;                  ///< unit stride along the tile's contiguous dim, aligned
};

/// Issues the loads of the tile at (row0, k0) into `s`. Chunks past the
/// extents are zero-filled (partial chunks: the bytes inside only).
template <int kRows, bool kKMajor, class T>
__device__ __forceinline__ void issue_tile(T* s, const TileSource& src, int64_t row0, int64_t k0) {
  const T* base = static_cast<const T*>(src.base);
  if (src.vector) {
    constexpr int kChunksK = kTcK / 8, kChunksR = kRows / 8;
    for (int e = threadIdx.x; e < kRows * kTcK / 8; e += kTcThreads) {
      // The chunk's tile row r and K index k (8 elements along the contiguous one).
      const int r = kKMajor ? e / kChunksK : (e % kChunksR) * 8, k = kKMajor ? (e % kChunksK) * 8 : e / kChunksR;
      const int64_t gr = row0 + r, gk = k0 + k;
      const int64_t left = kKMajor ? src.ks - gk : src.rows - gr;  // elements left along the contiguous dim
      const bool inside = (kKMajor ? gr < src.rows : gk < src.ks) && left > 0;
      const int bytes = inside ? int(left < 8 ? left : 8) * int(sizeof(T)) : 0;
      T* dst = kKMajor ? s + r * (kTcK + kPad) + k : s + k * (kRows + kPad) + r;
      const T* from = inside ? base + gr * src.row_stride + gk * src.k_stride : base;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(from),
                   "r"(bytes)
                   : "memory");
#else
      for (int i = 0; i < 8; ++i) dst[i] = i * int(sizeof(T)) < bytes ? from[i] : T(0.f);
#endif
    }
  } else {
    for (int e = threadIdx.x; e < kRows * kTcK; e += kTcThreads) {
      // Consecutive threads walk the operand's smaller stride.
      const bool rows_fast = (src.row_stride < 0 ? -src.row_stride : src.row_stride) <=
                             (src.k_stride < 0 ? -src.k_stride : src.k_stride);
      const int r = rows_fast ? e % kRows : e / kTcK, k = rows_fast ? e / kRows : e % kTcK;
      const int64_t gr = row0 + r, gk = k0 + k;
      const T v = gr < src.rows && gk < src.ks ? base[gr * src.row_stride + gk * src.k_stride] : T(0.f);
      (kKMajor ? s[r * (kTcK + kPad) + k] : s[k * (kRows + kPad) + r]) = v;
    }
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

template <class T, bool kAK, bool kBK>
__global__ void __launch_bounds__(kTcThreads) grouped_tc(const GroupedProblem p, bool a_vector, bool b_vector) {
  constexpr int kTileA = tile_elems<kTcM, kAK>(), kTileB = tile_elems<kTcN, kBK>();
  __shared__ __align__(16) T smem[2 * (kTileA + kTileB)];
  // Stage s: sA(s) [M][K + pad] or [K][M + pad], sB(s) [N][K + pad] or [K][N + pad] (computed, not an
  // array of pointers indexed at run time: that would live in local memory).
  auto sA = [&](int stage) { return smem + stage * kTileA; };
  auto sB = [&](int stage) { return smem + 2 * kTileA + stage * kTileB; };
  const int64_t m0 = int64_t(blockIdx.y) * kTcM, n0 = int64_t(blockIdx.x) * kTcN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // this warp's 64 x 32 of the tile
  for_each_segment<kTcM>(p, m0, [&](const Segment& s) {
    const TileSource a{reinterpret_cast<const T*>(p.a.data) + s.group * p.a.group, p.a.row, p.a.col, p.m, p.k, a_vector};
    const TileSource b{reinterpret_cast<const T*>(p.b.data) + s.group * p.b.group, p.b.col, p.b.row, p.n, p.k, b_vector};
    float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
    const int64_t k_begin = s.k_lo / kTcK * kTcK;
    const int64_t tiles = s.k_hi > s.k_lo ? (s.k_hi - k_begin + kTcK - 1) / kTcK : 0;
    if (tiles > 0) {
      issue_tile<kTcM, kAK>(sA(0), a, m0, k_begin);
      issue_tile<kTcN, kBK>(sB(0), b, n0, k_begin);
    }
    cp_async_commit();
    for (int64_t t = 0; t < tiles; ++t) {
      const int stage = int(t & 1);
      const int64_t k0 = k_begin + t * kTcK;
      if (t + 1 < tiles) {  // the next tile streams in while this one is used
        issue_tile<kTcM, kAK>(sA(stage ^ 1), a, m0, k0 + kTcK);
        issue_tile<kTcN, kBK>(sB(stage ^ 1), b, n0, k0 + kTcK);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      if (k0 < s.k_lo || k0 + kTcK > s.k_hi) {  // a group edge inside the tile
        mask_k<kTcM, kAK>(sA(stage), k0, s.k_lo, s.k_hi);
        mask_k<kTcN, kBK>(sB(stage), k0, s.k_lo, s.k_hi);
        __syncthreads();
      }
      const T* tA = sA(stage);
      const T* tB = sB(stage);
#pragma unroll
      for (int kk = 0; kk < kTcK; kk += 16) {
        uint32_t af[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          const int r = wm + mt * 16;
          if constexpr (kAK)
            ldmatrix_x4(af[mt], tA + (r + lane % 16) * (kTcK + kPad) + kk + (lane / 16) * 8);
          else
            ldmatrix_x4_trans(af[mt], tA + (kk + (lane & 7) + (lane >> 4) * 8) * (kTcM + kPad) + r + ((lane >> 3) & 1) * 8);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int c = wn + np * 16;
          uint32_t bf[4];
          if constexpr (kBK)
            ldmatrix_x4(bf, tB + (c + (lane & 7) + ((lane >> 4) << 3)) * (kTcK + kPad) + kk + ((lane >> 3) & 1) * 8);
          else
            ldmatrix_x4_trans(bf, tB + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * (kTcN + kPad) + c + (lane >> 4) * 8);
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            mma_16x8x16<T>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_16x8x16<T>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
      __syncthreads();  // this stage is refilled two tiles on
    }
    cp_async_wait<0>();
    T* gD = reinterpret_cast<T*>(p.d.data) + s.group * p.d.group;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t m = m0 + wm + mt * 16 + lane / 4 + 8 * half;
        if (m < s.m_lo || m >= s.m_hi) continue;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t n = n0 + wn + nt * 8 + 2 * (lane % 4);
          const float lo = acc[mt][nt][2 * half], hi = acc[mt][nt][2 * half + 1];
          T* at = gD + m * p.d.row + n * p.d.col;
          if (n + 1 < p.n && p.d.col == 1 && reinterpret_cast<uintptr_t>(at) % 4 == 0) {
            *reinterpret_cast<uint32_t*>(at) = attn::pack2<T>(lo, hi);  // both columns in one store
          } else {
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

template <class T, bool kAK, bool kBK>
Status launch_tc(const GroupedProblem& p, dim3 grid, CUstream_st* stream) {
  const bool a_vec = vector_source(p.a, kAK, p.a.row, p.a.col), b_vec = vector_source(p.b, kBK, p.b.col, p.b.row);
  grouped_tc<T, kAK, kBK><<<grid, kTcThreads, 0, stream>>>(p, a_vec, b_vec);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
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
