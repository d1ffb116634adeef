// CUDA scans along rows (the scanned dim moved last). Bitwise deterministic:
// every combine happens in a fixed order, no atomics.
//  - tiles: a block scans TILE = kBlock x kItems elements at a time (loaded
//    coalesced through shared memory, a thread scans kItems in registers,
//    warps combine by shuffles), carrying the total from tile to tile;
//  - long rows on few rows are cut into tiles across blocks, scanned in a
//    single pass (Note [Deterministic single-pass scan]);
//  - a thread per row when rows are short or strided and many.
#pragma once

#include <cstring>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "core/rows.hpp"
#include "scan/ops.hpp"
#include "scan/register.hpp"

namespace baracuda::scan {

using rows::OffsetCalc;
using rows::RowLaunch;


/// Shared-memory slot of tile element i: one pad per 32 keeps a thread's
/// kItems consecutive reads free of bank conflicts.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5); }

template <class S>
__device__ __forceinline__ S shfl_up(S v, int d) {
  static_assert(sizeof(S) % 4 == 0);
  int words[sizeof(S) / 4];
  memcpy(words, &v, sizeof(S));
#pragma unroll
  for (int k = 0; k < int(sizeof(S) / 4); ++k) words[k] = __shfl_up_sync(0xffffffffu, words[k], d);
  memcpy(&v, words, sizeof(S));
  return v;
}

/// The widest word (at most 16 bytes) that divides `bytes`.
template <size_t bytes>
using run_word_t = std::conditional_t<
    bytes % 16 == 0, uint4,
    std::conditional_t<bytes % 8 == 0, uint2,
                       std::conditional_t<bytes % 4 == 0, unsigned, std::conditional_t<bytes % 2 == 0, unsigned short, unsigned char>>>>;

/// N consecutive elements at p in the widest words their bytes allow (p must
/// be aligned to that word: a 16-byte aligned row start and e0 a multiple of N).
template <int N, class T>
__device__ __forceinline__ void load_run(const T* p, T (&x)[N]) {
  using W = run_word_t<N * sizeof(T)>;
  W w[N * sizeof(T) / sizeof(W)];
#pragma unroll
  for (int k = 0; k < int(sizeof(w) / sizeof(W)); ++k) w[k] = reinterpret_cast<const W*>(p)[k];
  memcpy(x, w, sizeof(w));
}
template <int N, class T>
__device__ __forceinline__ void store_run(T* p, const T (&x)[N]) {
  using W = run_word_t<N * sizeof(T)>;
  W w[N * sizeof(T) / sizeof(W)];
  memcpy(w, x, sizeof(w));
#pragma unroll
  for (int k = 0; k < int(sizeof(w) / sizeof(W)); ++k) reinterpret_cast<W*>(p)[k] = w[k];
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Runs of N elements [e0, e0 + N) (e0 a multiple of N) of a row at p with
/// stride s = 1, or -1 (the reversed views of the gradients): their lowest
/// address, and whether every run of the row is 16-byte aligned.
template <int N, class T>
__device__ __forceinline__ T* run_start(T* p, int64_t s, int64_t e0) {
  return s == 1 ? p + e0 : p - e0 - (N - 1);
}
template <int N, class T>
__device__ __forceinline__ bool run_ok(const T* p, int64_t s) {
  return (s == 1 && aligned16(p)) || (s == -1 && aligned16(p - (N - 1)));
}

/// Barrier of the kBlock threads that scan: __syncthreads() (kId 0), or named
/// barrier kId where the block has more threads (streamed_scan_kernel's look-back warp).
template <int kId>
__device__ __forceinline__ void scan_threads_sync() {
  if constexpr (kId == 0) {
    __syncthreads();
  } else {
    named_sync(kId, kBlock);
  }
}

/// Exclusive prefix (from `carry`) of each thread's `v` in thread order, and
/// the block total combined into `carry`. Every thread that scans (the first
/// kBlock, which barrier kBarrier joins) calls it.
template <class Op, int kBarrier = 0, class S = typename Op::S>
__device__ __forceinline__ S block_exclusive(S v, S& carry, S* warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  S inc = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const S y = shfl_up(inc, d);
    if (lane >= d) inc = Op::combine(y, inc);
  }
  if (lane == 31) warp_totals[warp] = inc;
  scan_threads_sync<kBarrier>();
  S before = carry;  // carry + the warps before this one
  for (int w = 0; w < warp; ++w) before = Op::combine(before, warp_totals[w]);
  S exclusive = shfl_up(inc, 1);
  exclusive = lane == 0 ? before : Op::combine(before, exclusive);
  S total = carry;
  for (int w = 0; w < kBlock / 32; ++w) total = Op::combine(total, warp_totals[w]);
  scan_threads_sync<kBarrier>();  // warp_totals is reused by the next call
  carry = total;
  return exclusive;
}

/// The operands of a forward scan: load lifts input e, store writes output e.
template <class Op_, class T, class Out>
struct ScanIo {
  using Op = Op_;
  using M = scan_math_t<T>;
  using S = typename Op::S;
  static constexpr int kOperands = 3;
  const T* in;
  Out* out;
  int64_t* idx;
  int64_t si, so, sx;
  static __host__ __device__ int probe(const ScanLaunch& l) { return l.indices ? 2 : 1; }
  __device__ ScanIo(const ScanLaunch& l, const int64_t* off, int64_t) {
    const int i = probe(l);
    const auto& st = l.rows.inner.stride;
    in = reinterpret_cast<const T*>(l.rows.data[i]) + (i == 2 ? off[2] : off[1]);  // no run-time index into off (local memory)
    out = reinterpret_cast<Out*>(l.rows.data[0]) + off[0];
    idx = l.indices ? reinterpret_cast<int64_t*>(l.rows.data[1]) + off[1] : nullptr;
    si = st[i][0];
    so = st[0][0];
    sx = l.indices ? st[1][0] : 0;
  }
  __device__ S load(int64_t e) const { return Op::lift(convert<M>(in[e * si]), e); }
  __device__ void store(int64_t e, const S& s) const {
    if constexpr (std::is_same_v<S, Extreme<M>>) {
      out[e * so] = convert<Out>(s.v);
      idx[e * sx] = s.i;
    } else {
      out[e * so] = convert<Out>(s);
    }
  }
  // Runs of consecutive elements (Note [Vectorised single-pass tiles]): every
  // operand is a plain array of its element type. Sums and products of 4-byte
  // elements move faster coalesced through shared memory.
  static constexpr bool kRuns = !(sizeof(T) == 4 && sizeof(S) == 4 && cheap_combine<Op>::value);
  /// Rows of stride 1 may take streamed_scan_kernel (Note [Streamed single-pass tiles]): sums and products
  /// of f32, f16 or bf16 elements (an f32 state) written in their own type.
  static constexpr bool kStreams = cheap_combine<Op>::value && sizeof(S) == 4 && std::is_same_v<T, Out> &&
                                   (std::is_same_v<T, S> || (sizeof(T) == 2 && is_float_v<T>));
  using In = T;
  static constexpr size_t kInBytes = sizeof(T);
  /// True when every operand of this row has stride 1 or -1 (cumsum_backward's reversed views) and its runs
  /// of N are 16-byte aligned.
  template <int N>
  __device__ bool runs() const {
    return run_ok<N>(in, si) && run_ok<N>(out, so) && (idx == nullptr || run_ok<N>(idx, sx));
  }
  /// Elements [e0, e0 + N) with e0 a multiple of N.
  template <int N>
  __device__ void load_run(int64_t e0, S (&v)[N]) const {
    T x[N];
    scan::load_run(run_start<N>(in, si, e0), x);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = Op::lift(convert<M>(si == 1 ? x[k] : x[N - 1 - k]), e0 + k);
  }
  template <int N>
  __device__ void store_run(int64_t e0, const S (&v)[N]) const {
    Out y[N];  // memory order: selected values, never a run-time index into registers
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const S s = so == 1 ? v[k] : v[N - 1 - k];
      if constexpr (std::is_same_v<S, Extreme<M>>) {
        y[k] = convert<Out>(s.v);
      } else {
        y[k] = convert<Out>(s);
      }
    }
    scan::store_run(run_start<N>(out, so, e0), y);
    if constexpr (std::is_same_v<S, Extreme<M>>) {
      int64_t i[N];
#pragma unroll
      for (int k = 0; k < N; ++k) i[k] = sx == 1 ? v[k].i : v[N - 1 - k].i;
      scan::store_run(run_start<N>(idx, sx, e0), i);
    }
  }
};

/// The operands of a gradient scan, every view reversed along the row
/// (Note [Scan gradients as reversed scans]): 0 = grad_input, 1 = grad_output,
/// 2 = input, 3 = the saved output or indices (I: their element type).
template <class T, class I = T>
struct GradIo {
  using M = scan_math_t<T>;
  static constexpr int kOperands = 4;
  // Each position reads its neighbour's operands: no runs, the scalar path.
  static constexpr bool kRuns = false, kStreams = false;
  static constexpr size_t kInBytes = sizeof(T);
  T* dx;
  const T *g, *x;
  const I* saved;
  int64_t sd, sg, sx, ss, n;
  static __host__ __device__ int probe(const ScanLaunch&) { return 1; }
  __device__ GradIo(const ScanLaunch& l, const int64_t* off, int64_t cols) : n(cols) {
    const auto& st = l.rows.inner.stride;
    dx = reinterpret_cast<T*>(l.rows.data[0]) + off[0];
    g = reinterpret_cast<const T*>(l.rows.data[1]) + off[1];
    x = reinterpret_cast<const T*>(l.rows.data[2]) + off[2];
    saved = reinterpret_cast<const I*>(l.rows.data[3]) + off[3];
    sd = st[0][0], sg = st[1][0], sx = st[2][0], ss = st[3][0];
  }
  __device__ M G(int64_t e) const { return convert<M>(g[e * sg]); }
  __device__ M X(int64_t e) const { return convert<M>(x[e * sx]); }
};

/// cumprod: lifts r -> x_{i+1} r + g_i; stores out_{i-1} * R_i.
template <class T>
struct CumProdGradIo : GradIo<T> {
  using M = scan_math_t<T>;
  using Op = AffineScan<M>;
  using S = typename Op::S;
  using GradIo<T>::GradIo;
  __device__ S load(int64_t e) const { return S{e > 0 ? this->X(e - 1) : M(1), this->G(e)}; }
  __device__ void store(int64_t e, const S& s) const {
    const M before = e + 1 < this->n ? convert<M>(this->saved[(e + 1) * this->ss]) : M(1);
    this->dx[e * this->sd] = convert<T>(before * s.b);
  }
};

/// logcumsumexp: lifts g_j exp(-y_j); stores exp(x_i) times the running sum.
template <class T>
struct LogCumSumExpGradIo : GradIo<T> {
  using M = scan_math_t<T>;
  using Op = ScaledSum<M>;
  using S = typename Op::S;
  using GradIo<T>::GradIo;
  __device__ S load(int64_t e) const { return S{-convert<M>(this->saved[e * this->ss]), this->G(e)}; }
  __device__ void store(int64_t e, const S& s) const { this->dx[e * this->sd] = convert<T>(Op::scale(s, this->X(e))); }
};

/// cummax/cummin: heads where the index changes; position k keeps its run's sum when idx_k == k.
template <class T>
struct CumExtremeGradIo : GradIo<T, int64_t> {
  using M = scan_math_t<T>;
  using Op = SegmentedSum<M>;
  using S = typename Op::S;
  using GradIo<T, int64_t>::GradIo;
  __device__ int64_t index(int64_t e) const { return this->saved[e * this->ss]; }
  __device__ S load(int64_t e) const { return S{this->G(e), e == 0 || index(e) != index(e - 1)}; }
  __device__ void store(int64_t e, const S& s) const {
    this->dx[e * this->sd] = convert<T>(index(e) == this->n - 1 - e ? s.sum : M(0));
  }
};

/// Shuffle down by d (lanes past the end get their own value).
template <class S>
__device__ __forceinline__ S shfl_down(S v, int d) {
  int words[sizeof(S) / 4];
  memcpy(words, &v, sizeof(S));
#pragma unroll
  for (int k = 0; k < int(sizeof(S) / 4); ++k) words[k] = __shfl_down_sync(0xffffffffu, words[k], d);
  memcpy(&v, words, sizeof(S));
  return v;
}

/// A block scans one row, tile by tile, carrying the total.
template <class Io>
__global__ void __launch_bounds__(kBlock) tile_scan_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  __shared__ S tile[kTile + kTile / 32];
  __shared__ S warp_totals[kBlock / 32];
  int64_t off[Io::kOperands];
  outer.get(blockIdx.x, off);
  const Io io(l, off, l.rows.cols);
  const int64_t end = l.rows.cols;
  S carry = Op::identity();
  S next[kItems];  // the next tile, loaded (coalesced) while this one is scanned
  auto load_tile = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t e = base + k * kBlock + threadIdx.x;
      next[k] = e < end ? io.load(e) : Op::identity();
    }
  };
  load_tile(0);
  for (int64_t base = 0; base < end; base += kTile) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) tile[padded(k * kBlock + threadIdx.x)] = next[k];
    __syncthreads();
    if (base + kTile < end) load_tile(base + kTile);
    S v[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) v[k] = tile[padded(threadIdx.x * kItems + k)];
#pragma unroll
    for (int k = 1; k < kItems; ++k) v[k] = Op::combine(v[k - 1], v[k]);
    const S prefix = block_exclusive<Op>(v[kItems - 1], carry, warp_totals);
#pragma unroll
    for (int k = 0; k < kItems; ++k) tile[padded(threadIdx.x * kItems + k)] = Op::combine(prefix, v[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kItems; ++k) {  // coalesced stores
      const int64_t e = base + k * kBlock + threadIdx.x;
      if (e < end) io.store(e, tile[padded(k * kBlock + threadIdx.x)]);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------- single pass
// Note [Deterministic single-pass scan]
// Rows cut across blocks are scanned in one pass over memory (read once,
// written once). Tiles take their index from a ticket counter, so a tile
// only ever waits for tiles that already run (forward progress without
// co-residency assumptions). Each tile:
//  1. loads its elements and scans them in the block, giving its aggregate
//     A(j), published at once;
//  2. warp 0 computes its exclusive prefix by one FIXED formula,
//       E(j) = P(j - W) + A(j - W + 1) + ... + A(j - 1)      (W = kWindow)
//     (P, A of tiles before the row start are the identity), lane l
//     combining window slots [l K, l K + K) in order, then a fixed
//     shuffle tree over the lanes, left operand always the earlier slots;
//  3. publishes its inclusive prefix P(j) = E(j) + A(j), and writes its
//     elements from E(j).
// No value depends on which predecessor happened to be ready first (CUB's
// decoupled look-back sums aggregates until it meets an inclusive prefix:
// timing-dependent), so outputs are bitwise equal from run to run. The
// chain of dependent inter-block hops is tiles / W long, while every tile
// polls W slots: W trades one against the other. Measured on H100 (64M-element
// cumsum, f32 / bf16 TB/s): W = 32: 1.29 / 1.16, 64: 1.55 / 1.34,
// 128: 1.59 / 1.30, 256: 1.33 / 1.18, 512: 0.89 / 0.83. W = 128 (K = 4).
// A tree of group sums instead (fan-in W, the last tile of a group publishing
// its sum, every tile reading its preceding siblings level by level: at most
// log_W(tiles) waits, no chain) measured slower (f32 cumsum 1.63, bf16 1.28,
// f32 cummax 0.90 -> 0.60 TB/s): a tile polls once a level, and a group's
// sum still waits for its last tile, which waits for the group's W tiles.
// Memory ordering: states of 4 bytes travel in one 64-bit word with their
// ready bit (a relaxed 64-bit access is single-copy atomic, nothing else to
// order). Larger states go to a separate array: the writer stores the state,
// __threadfence(), then sets the flag; the reader polls flags (relaxed),
// __threadfence() once all are set (the acquire pattern), then reads the
// states bypassing L1 (ld.cg). The workspace (ticket counter, flags) is
// cleared in the stream before every launch.

/// Tile slots looked back over (one warp, kWindowPerLane slots a lane).
inline constexpr int kWindowPerLane = 4, kWindow = 32 * kWindowPerLane;

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/// The words of a state, for L2-only (ld.cg / st.cg) copies.
template <class S>
using state_word_t = std::conditional_t<sizeof(S) % 16 == 0, uint4, std::conditional_t<sizeof(S) % 8 == 0, uint2, unsigned>>;

/// Published tile states: slot t (aggregates) and slots + t (inclusive prefixes).
template <class S, bool kPacked = sizeof(S) == 4>
struct TileStates;

template <class S>
struct TileStates<S, true> {  // one 64-bit word per slot: state bits high, ready bit low
  unsigned long long* word;
  static constexpr size_t bytes(int64_t slots) { return size_t(slots) * 8; }
  static constexpr size_t reset_bytes(int64_t slots) { return bytes(slots); }
  __host__ __device__ TileStates(void* ws, int64_t) : word(static_cast<unsigned long long*>(ws)) {}
  __device__ void publish(int64_t slot, const S& s) const {
    unsigned bits;
    memcpy(&bits, &s, 4);
    st_relaxed(word + slot, (static_cast<unsigned long long>(bits) << 32) | 1u);
  }
  __device__ bool poll(int64_t slot, S& s) const {
    const unsigned long long w = ld_relaxed(word + slot);
    const unsigned bits = unsigned(w >> 32);
    memcpy(&s, &bits, 4);
    return w & 1u;
  }
  __device__ void acquire() const {}
  __device__ void read(int64_t, S&) const {}
};

template <class S>
struct TileStates<S, false> {  // a flag array, then the states (16-byte aligned)
  using W = state_word_t<S>;
  static constexpr int kWords = sizeof(S) / sizeof(W);
  unsigned* flag;
  W* state;
  static constexpr size_t flag_bytes(int64_t slots) { return (size_t(slots) * 4 + 15) / 16 * 16; }
  static constexpr size_t bytes(int64_t slots) { return flag_bytes(slots) + size_t(slots) * sizeof(S); }
  static constexpr size_t reset_bytes(int64_t slots) { return flag_bytes(slots); }
  __host__ __device__ TileStates(void* ws, int64_t slots)
      : flag(static_cast<unsigned*>(ws)), state(reinterpret_cast<W*>(static_cast<char*>(ws) + flag_bytes(slots))) {}
  __device__ void publish(int64_t slot, const S& s) const {
    W w[kWords];
    memcpy(w, &s, sizeof(S));
#pragma unroll
    for (int k = 0; k < kWords; ++k) __stcg(state + slot * kWords + k, w[k]);
    __threadfence();
    st_relaxed(flag + slot, 1u);
  }
  __device__ bool poll(int64_t slot, S&) const { return ld_relaxed(flag + slot) != 0; }
  __device__ void acquire() const { __threadfence(); }
  __device__ void read(int64_t slot, S& s) const {
    W w[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = __ldcg(state + slot * kWords + k);
    memcpy(&s, w, sizeof(S));
  }
};

/// Elements per thread of the single-pass kernel (Note [Vectorised
/// single-pass tiles]): 16 (4K-element tiles), 32 for 4-byte states over
/// inputs of 4 bytes or fewer (8K-element tiles: half the look-back hops),
/// 64 for the sums and products of half types that stream (16K-element
/// tiles, 32 KiB as f32's: half their look-back hops again; H100, bf16 64M
/// cumsum 2.00 -> 2.29 TB/s), 8 for 16-byte states (the tile is staged in
/// static shared memory on the scalar path).
template <class Io, class S = typename Io::S>
inline constexpr int kPassItems = sizeof(S) > 8                          ? 8
                                  : Io::kStreams && Io::kInBytes == 2   ? 64
                                  : sizeof(S) == 4 && Io::kInBytes <= 4 ? 32
                                                                        : 16;
/// Blocks an SM the single-pass kernel asks for: 4 for 4-byte states over
/// 16 items (at most 64 registers), 3 over 32 (at 64 they spilled), 2 over 64.
template <class Io, class S = typename Io::S>
inline constexpr int kPassBlocks = sizeof(S) != 4 ? 1 : kPassItems<Io> > 32 ? 2 : kPassItems<Io> > 16 ? 3 : 4;

/// Exclusive prefix E(j) of tile j of a row whose tile 0 has slot `first`
/// (Note [Deterministic single-pass scan]); one warp calls it (warp 0, or the
/// streamed kernel's look-back warp), its lane 0 gets it.
/// kInterleaved (commutative ops only): lane l combines window slots l, l + 32, ... instead of [l K, l K + K),
/// so a warp's poll of slot k reads 256 consecutive bytes (H200 64M cumsum, the streamed kernel blocking on its
/// look-back: f32 2.80 -> 2.89 TB/s, bf16 2.52 -> 2.59).
template <class Op, bool kInterleaved = false, class States, class S = typename Op::S>
__device__ __forceinline__ S look_back(const States& st, int64_t slots, int64_t first, int64_t j) {
  constexpr int K = kWindowPerLane;
  const int lane = threadIdx.x % 32;
  // Window slot w (lane K + k, or k 32 + lane interleaved) is tile j - kWindow + w (slots before the row: the
  // identity); w = 0 reads the inclusive prefix P(j - W). The slot numbers are recomputed, not kept (registers:
  // the caller holds its tile).
  auto tile_of = [&](int k) { return kInterleaved ? j - kWindow + k * 32 + lane : j - kWindow + lane * K + k; };
  auto slot = [&](int k) { return first + tile_of(k) + (lane == 0 && k == 0 ? slots : 0); };
  S v[K];
  unsigned ready = 0;  // bit k: slot k read (or before the row)
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = Op::identity();
    if (tile_of(k) < 0) ready |= 1u << k;
  }
  const unsigned before_row = ready;
  for (;;) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (!(ready >> k & 1u) && st.poll(slot(k), v[k])) ready |= 1u << k;
    if (__all_sync(0xffffffffu, ready == (1u << K) - 1)) break;
  }
  st.acquire();
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (!(before_row >> k & 1u)) st.read(slot(k), v[k]);
  S acc = v[0];
#pragma unroll
  for (int k = 1; k < K; ++k) acc = Op::combine(acc, v[k]);
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const S later = shfl_down(acc, d);
    if ((lane & (2 * d - 1)) == 0) acc = Op::combine(acc, later);
  }
  return acc;
}

// Note [Vectorised single-pass tiles]
// Thread t of a tile owns its elements [t kIt, t kIt + kIt) and scans them in
// order, then the block scans the thread totals (block_exclusive: warps by
// shuffles, then the warp totals left to right). Where the Io's operands are
// plain arrays (Io::kRuns: the forward scans and cumsum_backward), every
// operand of the row of stride 1 or -1 (reversed views: a run read as one
// block and taken backwards) with 16-byte aligned runs, and the tile full, a
// thread moves its elements straight between registers and
// memory in 16-byte words (4 a thread for f32 and, with 32 items, f16/bf16);
// else (strided, misaligned, the last partial tile, the other gradients,
// whose positions read their neighbours) the tile goes through shared memory,
// loaded and stored coalesced element by element. The loads are issued
// before anything waits: the thread scan consumes them, then the aggregate
// is published before the look-back, so later tiles' look-backs overlap
// this tile's loads and its own look-back. Both paths give each
// thread the same elements, so the combine order, hence every bit of the
// result, is the same whichever path a tile takes. Runs pay where elements
// are narrow or the combine dear; sums and products of 4-byte elements
// (cheap_combine) take the shared-memory path for full tiles too: a thread's
// 16-byte stores 64 bytes apart write each 32-byte sector in two halves
// (H100, 64M elements, runs / coalesced TB/s: f32 cumsum 1.61 / 1.84, bf16
// cumsum 1.34 / 1.02, f32 logcumsumexp 1.10 / 0.99).

/// One tile (taken by ticket) of a row cut into `tiles` tiles.
template <class Io>
__global__ void __launch_bounds__(kBlock, kPassBlocks<Io>) single_pass_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer,
                                                                                      int64_t tiles) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  constexpr int kIt = kPassItems<Io>, kT = kBlock * kIt;
  __shared__ S tile[kT + kT / 32];
  __shared__ S warp_totals[kBlock / 32];
  __shared__ S exclusive;
  __shared__ unsigned long long ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(static_cast<unsigned long long*>(l.workspace), 1ull);
  __syncthreads();
  const int64_t t = int64_t(ticket), row = t / tiles, j = t % tiles, slots = l.rows.rows * tiles;
  const TileStates<S> states(static_cast<char*>(l.workspace) + kTicketBytes, 2 * slots);
  int64_t off[Io::kOperands];
  outer.get(row, off);
  const Io io(l, off, l.rows.cols);
  const int64_t base = j * kT, end = l.rows.cols, mine = base + threadIdx.x * kIt;
  bool runs = false;  // the same for the whole block
  if constexpr (Io::kRuns) runs = base + kT <= end && io.template runs<kIt>();
  S v[kIt];
  if constexpr (Io::kRuns) {
    if (runs) io.load_run(mine, v);
  }
  if (!runs) {
#pragma unroll
    for (int k = 0; k < kIt; ++k) {  // coalesced loads
      const int64_t e = base + k * kBlock + threadIdx.x;
      tile[padded(k * kBlock + threadIdx.x)] = e < end ? io.load(e) : Op::identity();
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kIt; ++k) v[k] = tile[padded(threadIdx.x * kIt + k)];
  }
#pragma unroll
  for (int k = 1; k < kIt; ++k) v[k] = Op::combine(v[k - 1], v[k]);
  S aggregate = Op::identity();
  S prefix = block_exclusive<Op>(v[kIt - 1], aggregate, warp_totals);  // its barriers guard the tile's reuse
  if (threadIdx.x == 0) states.publish(t, aggregate);
  if (threadIdx.x < 32) {
    const S e = look_back<Op>(states, slots, t - j, j);
    if (threadIdx.x == 0) {
      states.publish(slots + t, Op::combine(e, aggregate));
      exclusive = e;
    }
  }
  __syncthreads();
  prefix = Op::combine(exclusive, prefix);
#pragma unroll
  for (int k = 0; k < kIt; ++k) v[k] = Op::combine(prefix, v[k]);
  if constexpr (Io::kRuns) {
    if (runs) {
      io.store_run(mine, v);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < kIt; ++k) tile[padded(threadIdx.x * kIt + k)] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kIt; ++k) {  // coalesced stores
    const int64_t e = base + k * kBlock + threadIdx.x;
    if (e < end) io.store(e, tile[padded(k * kBlock + threadIdx.x)]);
  }
}

// Note [Streamed single-pass tiles]
// Sums and products of rows of stride 1 in f32, f16 or bf16 (the 64M
// cumsum) take a persistent, software-pipelined variant of
// single_pass_kernel. There, tile j published its aggregate only once its
// block started on it, and its look-back waited for the aggregates of the W
// tiles before it, each from a block that had to finish its own previous
// tile first: every tile waited for the slowest of W blocks, and while it
// waited its SM issued no loads. Here each block takes tickets in a loop and
// keeps three tiles in three shared-memory stages:
//  - tile d, just ticketed, copying in (cp.async, 16 bytes a copy, coalesced);
//  - tile b, landed: scanned at once, its aggregate A(b) published, and its
//    look-back handed to the block's look-back warp;
//  - tile a, scanned one step earlier: its output, from the look-back warp's
//    answer E(a).
// So an aggregate is published as soon as its tile's data is in, a step
// before the look-backs that need it, and loads stay in flight through the
// waits. The look-back warp (a ninth warp; requests and answers through
// named barriers, two of each, by parity) polls while the eight scanning
// warps output a, take the next ticket, wait for b's data and scan it: where
// warp 0 looked back between b's scan and a's output, the block waited for
// it at a barrier (H200 64M cumsum, f32 2.89 -> 3.03-3.08 TB/s, bf16 2.59 ->
// 2.76-2.81, both offset by one element +9%). It combines the window's
// slots interleaved across its lanes (sums and products commute). W = 128
// (f32 / bf16 against it: W = 64 -8% / -5%, 256 -1% / +2%, 512 -18% / -11%).
// Prefetching the next ticket ran 2% slower; backing off (nanosleep)
// between polls changed nothing.
// Forward progress without co-residency: the earliest tile m without a
// published prefix belongs to some block; every request that block made
// before m is answered (their tiles precede m), so its scanning warps reach
// and request m without waiting on another block, and m's look-back needs
// only tiles before m, all done. Thread o owns elements [N o, N o + N),
// N = 32 f32 or 64 half elements, C = 8 16-byte chunks (the output pass
// rescans a's elements from the stage: N adds, no registers held across the
// look-back). A stage holds its tile swizzled: thread o's chunk q sits at
// chunk C o + (q ^ key(o)), key(o) = (C o / 8) mod C, so the coalesced
// copies (8 consecutive chunks a wavefront) and the reads of 8 threads of
// their own chunk q touch every 16-byte bank group once a wavefront. Outputs
// go back through the stage in the input's type and leave coalesced, in
// 16-byte stores: where the tile's output is not 16-byte aligned (a view
// from element 1), each store takes the last bytes of one stage chunk and
// the first of the next (bytes_from), and the tile's ends that share a
// 16-byte word with the neighbouring tiles go element by element. Inputs
// not 16-byte aligned copy in 4-byte copies in f32; in the half types
// (2-byte aligned) a tile copies the kChunks + 1 aligned 16-byte words that
// cover it into a stage one chunk longer, its first scan reads each of its
// chunks from two neighbouring words (bytes_from) and, once every thread has
// read (the block scan's barrier), writes them back in the tile's own
// layout, so the output pass and the combines are those of an aligned tile
// (the same bits). A row's first tile when misaligned and its last, partial
// one are loaded element by element (synchronously) into the same layout.

/// Stages and elements a thread of streamed_scan_kernel (the single-pass
/// kernel's tiles: 32 KiB, 8K f32 or 16K half elements); two blocks an SM
/// (96 KiB of stages each).
inline constexpr int kStreamStages = 3;
template <size_t kElemBytes>
inline constexpr int kStreamItems = 128 / kElemBytes;
template <size_t kElemBytes>
inline constexpr int kStreamTile = kBlock * kStreamItems<kElemBytes>;
template <size_t kElemBytes>
inline constexpr int kStreamBlocks = 2;
/// A stage holds a tile and one more 16-byte chunk (a misaligned half-type tile's last word).
template <size_t kElemBytes>
inline constexpr size_t kStreamSmem = size_t(kStreamStages) * (kStreamTile<kElemBytes> * kElemBytes + 16);

/// Chunk of a stage that holds thread o's chunk q (C chunks a thread); the
/// stage's chunk that holds the tile's chunk c, and the element of tile
/// element i (E elements a chunk).
template <int C>
__device__ __forceinline__ int stream_chunk(int o, int q) {
  return o * C + (q ^ (o * C / 8 % C));
}
template <int C>
__device__ __forceinline__ int stage_chunk(int c) {
  return stream_chunk<C>(c / C, c % C);
}
template <int C, int E>
__device__ __forceinline__ int stage_element(int i) {
  return stage_chunk<C>(i / E) * E + i % E;
}

/// The 16 bytes at byte `shift` (0..15) of the 32 bytes lo, hi (lo first in memory).
__device__ __forceinline__ float4 bytes_from(const float4& lo, const float4& hi, int shift) {
  uint32_t w[8];
  memcpy(w, &lo, 16);
  memcpy(w + 4, &hi, 16);
  const int words = shift / 4;
  const unsigned r = unsigned(shift % 4), select = r | (r + 1) << 4 | (r + 2) << 8 | (r + 3) << 12;
  uint32_t u[5];
#pragma unroll
  for (int k = 0; k < 5; ++k)  // u[k] = w[k + words], no run-time index into registers
    u[k] = words == 0 ? w[k] : words == 1 ? w[k + 1] : words == 2 ? w[k + 2] : w[k + 3];
  uint32_t out[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = __byte_perm(u[k], u[k + 1], select);
  float4 f;
  memcpy(&f, out, 16);
  return f;
}

/// Stores a full tile of T, held in a stage (Note [Streamed single-pass
/// tiles]), to `out`, which is element- but not 16-byte aligned: the 16-byte
/// words of memory wholly inside the tile in coalesced 16-byte stores, each
/// taking the last `skew` bytes of a tile chunk and the first 16 - skew of the
/// next; the tile's first (16 - skew) / sizeof(T) elements and its last
/// skew / sizeof(T) (which share 16-byte words with the neighbouring tiles)
/// element by element.
template <class T, int C, int kChunks>
__device__ __forceinline__ void store_shifted_tile(const float4* stage, T* out) {
  constexpr int E = int(16 / sizeof(T));
  const int skew = int(reinterpret_cast<uintptr_t>(out) % 16), o = threadIdx.x;
  auto* first_whole = reinterpret_cast<float4*>(reinterpret_cast<char*>(out) + 16 - skew);
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int c = o + i * kBlock;
    if (c + 1 < kChunks) first_whole[c] = bytes_from(stage[stage_chunk<C>(c)], stage[stage_chunk<C>(c + 1)], 16 - skew);
  }
  const int head = (16 - skew) / int(sizeof(T)), tail = skew / int(sizeof(T));
  const T* elements = reinterpret_cast<const T*>(stage);
  if (o < head) {
    out[o] = elements[stage_element<C, E>(o)];
  } else if (o >= 32 && o < 32 + tail) {
    const int i = kChunks * E - tail + (o - 32);
    out[i] = elements[stage_element<C, E>(i)];
  }
}

/// Threads of streamed_scan_kernel: kBlock that scan, and the look-back warp.
inline constexpr int kStreamThreads = kBlock + 32;

template <class Io>
__global__ void __launch_bounds__(kStreamThreads, kStreamBlocks<Io::kInBytes>)
    streamed_scan_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer, int64_t tiles) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  using T = typename Io::In;
  using M = typename Io::M;
  static_assert(Io::kStreams && sizeof(S) == 4);
  constexpr int kIt = kStreamItems<sizeof(T)>, kT = kStreamTile<sizeof(T)>, E = int(16 / sizeof(T)), C = kIt / E;
  constexpr int kChunks = kT / E;
  static_assert(kChunks / kBlock == C, "a thread copies as many chunks as it owns");
  struct alignas(16) Chunk {
    T v[E];
  };
  extern __shared__ float4 stage_memory[];  // [kStreamStages][kChunks + 1]
  __shared__ S warp_totals[kBlock / 32];
  __shared__ unsigned long long ticket[2];  // alternate: a slot is rewritten only after barriers past its reads
  auto* counter = static_cast<unsigned long long*>(l.workspace);
  const int64_t slots = l.rows.rows * tiles;
  const TileStates<S> states(static_cast<char*>(l.workspace) + kTicketBytes, 2 * slots);
  const int o = threadIdx.x;
  auto stage = [&](int st) { return stage_memory + st * (kChunks + 1); };
  auto io_of = [&](int64_t t) {
    int64_t off[Io::kOperands];
    outer.get(t / tiles, off);
    return Io(l, off, l.rows.cols);
  };

  // The byte offset within its 16-byte word of tile t's first element, where the tile copies in as the
  // kChunks + 1 aligned words that cover it (half types; not a row's first tile, nor one that ends within
  // E elements of the row's end); else 0.
  auto skew_of = [&](const Io& io, int64_t t) {
    if constexpr (sizeof(T) != 2) {
      return 0;
    } else {
      const int64_t base = (t % tiles) * kT;
      const int skew = int(reinterpret_cast<uintptr_t>(io.in) % 16);  // base * 2 bytes is a multiple of 16
      return skew != 0 && base > 0 && base + kT + E <= l.rows.cols ? skew : 0;
    }
  };
  // Starts loading tile t into stage st: a full tile by asynchronous copies, a row's first (misaligned) and
  // last partial one by loads.
  auto fetch = [&](int64_t t, int st) {
    const Io io = io_of(t);
    const int64_t base = (t % tiles) * kT, end = l.rows.cols;
    T* elements = reinterpret_cast<T*>(stage(st));
    if (base + kT <= end && aligned16(io.in + base)) {
#pragma unroll
      for (int i = 0; i < C; ++i) {
        const int c = o + i * kBlock;
        cp_async_16(stage(st) + stage_chunk<C>(c), io.in + base + E * c, true);
      }
      return;
    }
    if (const int skew = skew_of(io, t)) {  // the aligned words from the one holding element base
      const T* first_word = io.in + base - skew / int(sizeof(T));
#pragma unroll
      for (int i = 0; i < C; ++i) {
        const int c = o + i * kBlock;
        cp_async_16(stage(st) + stage_chunk<C>(c), first_word + E * c, true);
      }
      if (o == 0) cp_async_16(stage(st) + stage_chunk<C>(kChunks), first_word + E * kChunks, true);
      return;
    }
    if constexpr (sizeof(T) == 4) {
      if (base + kT <= end) {
#pragma unroll 8
        for (int k = 0; k < kIt; ++k) {
          const int i = k * kBlock + o;
          cp_async_4(elements + stage_element<C, E>(i), io.in + base + i);
        }
        return;
      }
    }
    const T pad = convert<T>(Op::identity());
#pragma unroll 4
    for (int k = 0; k < kIt; ++k) {
      const int i = k * kBlock + o;
      const int64_t e = base + i;
      elements[stage_element<C, E>(i)] = e < end ? io.in[e] : pad;
    }
  };
  // Thread o's elements of tile t from its chunks, scanned in order.
  auto scan_chunks = [&](int64_t t, const float4 (&chunks)[C], S (&v)[kIt]) {
    const int64_t e0 = (t % tiles) * kT + kIt * o;
#pragma unroll
    for (int q = 0; q < C; ++q) {
      Chunk x;
      memcpy(&x, &chunks[q], 16);
#pragma unroll
      for (int k = 0; k < E; ++k) v[E * q + k] = Op::lift(convert<M>(x.v[k]), e0 + E * q + k);
    }
#pragma unroll
    for (int k = 1; k < kIt; ++k) v[k] = Op::combine(v[k - 1], v[k]);
  };
  // Thread o's chunks of stage st, each from two neighbouring words where the tile came in with a skew.
  auto read_chunks = [&](int st, int skew, float4 (&chunks)[C]) {
#pragma unroll
    for (int q = 0; q < C; ++q) {
      const int c = C * o + q;
      chunks[q] = skew == 0 ? stage(st)[stage_chunk<C>(c)]
                            : bytes_from(stage(st)[stage_chunk<C>(c)], stage(st)[stage_chunk<C>(c + 1)], skew);
    }
  };
  auto scan_mine = [&](int64_t t, int st, S (&v)[kIt]) {
    float4 chunks[C];
    read_chunks(st, 0, chunks);
    scan_chunks(t, chunks, v);
  };
  // Named barriers: 1 the scanning threads'; look-back request n (parity p) goes through 2 + p (the scanning
  // threads arrive, the look-back warp syncs) and its answer comes back through 4 + p (the other way round).
  constexpr int kSync = 1, kRequest = 2, kAnswer = 4;
  auto take = [&](int slot) {
    if (o == 0) ticket[slot] = atomicAdd(counter, 1ull);
    scan_threads_sync<kSync>();
    return int64_t(ticket[slot]);
  };
  __shared__ int64_t request_tile[2];
  __shared__ S request_aggregate[2], answer[2];
  if (o >= kBlock) {  // the look-back warp: E(t) into answer, P(t) = E(t) + A(t) published, until t >= slots
    for (int p = 0;; p ^= 1) {
      named_sync(kRequest + p, kStreamThreads);
      const int64_t t = request_tile[p], j = t % tiles;
      if (t >= slots) return;
      const S e = look_back<Op, /*kInterleaved=*/true>(states, slots, t - j, j);
      if (o == kBlock) {
        states.publish(slots + t, Op::combine(e, request_aggregate[p]));
        answer[p] = e;
      }
      named_arrive(kAnswer + p, kStreamThreads);
    }
  }
  int parity = 0;  // of the next request
  auto request = [&](int64_t t, const S& aggregate) {
    if (o == 0) {
      request_tile[parity] = t;
      request_aggregate[parity] = aggregate;
    }
    named_arrive(kRequest + parity, kStreamThreads);
    parity ^= 1;
  };

  // Tiles a, b, d of the note (>= slots: none) and their stages.
  int64_t a = slots, b = take(0), d = slots;
  if (b >= slots) {
    request(slots, Op::identity());  // the look-back warp stops
    return;
  }
  int sa = 2, sb = 0, sd = 1;
  S prefix_a = Op::identity();  // thread o's exclusive prefix within tile a
  fetch(b, sb);
  cp_async_commit();
  int slot = 1;
  while (a < slots || b < slots) {
    // take()'s barrier: every thread is past its stores from stage sd (the last tile a), which d reuses.
    d = b < slots ? take(slot) : slots;
    slot ^= 1;
    if (d < slots) fetch(d, sd);
    cp_async_commit();
    cp_async_wait<1>();
    scan_threads_sync<kSync>();  // stage sb complete

    S prefix_b = Op::identity(), aggregate_b = Op::identity();
    if (b < slots) {
      const int skew = skew_of(io_of(b), b);
      float4 chunks[C];
      read_chunks(sb, skew, chunks);
      S v[kIt];
      scan_chunks(b, chunks, v);
      prefix_b = block_exclusive<Op, kSync>(v[kIt - 1], aggregate_b, warp_totals);
      if (o == 0) states.publish(b, aggregate_b);
      request(b, aggregate_b);
      if (skew != 0) {  // every thread has read stage sb (block_exclusive's barrier): the tile's own layout
#pragma unroll
        for (int q = 0; q < C; ++q) stage(sb)[stream_chunk<C>(o, q)] = chunks[q];
      }
    } else {
      request(slots, Op::identity());  // no more tiles: the look-back warp stops
    }
    if (a < slots) {
      const int64_t base = (a % tiles) * kT, end = l.rows.cols;
      named_sync(kAnswer + parity, kStreamThreads);  // a's answer: two requests back, the same parity
      const S prefix = Op::combine(answer[parity], prefix_a);
      S v[kIt];
      scan_mine(a, sa, v);
#pragma unroll
      for (int q = 0; q < C; ++q) {
        Chunk y;
#pragma unroll
        for (int k = 0; k < E; ++k) y.v[k] = convert<T>(Op::combine(prefix, v[E * q + k]));
        float4 raw;
        memcpy(&raw, &y, 16);
        stage(sa)[stream_chunk<C>(o, q)] = raw;
      }
      scan_threads_sync<kSync>();
      const Io io = io_of(a);
      const uintptr_t out_address = reinterpret_cast<uintptr_t>(io.out + base);
      if (base + kT <= end && out_address % 16 == 0) {
#pragma unroll
        for (int i = 0; i < C; ++i) {  // coalesced 16-byte stores
          const int c = o + i * kBlock;
          reinterpret_cast<float4*>(io.out + base)[c] = stage(sa)[stage_chunk<C>(c)];
        }
      } else if (base + kT <= end && out_address % sizeof(T) == 0) {
        store_shifted_tile<T, C, kChunks>(stage(sa), io.out + base);
      } else {
        const T* elements = reinterpret_cast<const T*>(stage(sa));
#pragma unroll 4
        for (int k = 0; k < kIt; ++k) {
          const int i = k * kBlock + o;
          if (base + i < end) io.out[base + i] = elements[stage_element<C, E>(i)];
        }
      }
    }
    // Rotate: b becomes a, d becomes b, a's stage takes the next d.
    const int free_stage = sa;
    a = b, sa = sb, prefix_a = prefix_b;
    b = d, sb = sd;
    sd = free_stage;
  }
}

/// Whether a split scan can stream (Note [Streamed single-pass tiles]): the
/// input and output of stride 1 along the rows, their elements at addresses
/// that are multiples of their size.
template <class Io>
bool streams(const ScanLaunch& l) {
  if constexpr (!Io::kStreams) {
    return false;
  } else {
    const int in = Io::probe(l);
    const rows::RowLaunch& r = l.rows;
    if (r.inner.stride[0][0] != 1 || r.inner.stride[in][0] != 1) return false;
    return reinterpret_cast<uintptr_t>(r.data[in]) % Io::kInBytes == 0 &&
           reinterpret_cast<uintptr_t>(r.data[0]) % Io::kInBytes == 0;
  }
}

/// One thread per row, sequential along it.
template <class Io>
__global__ void __launch_bounds__(256) row_per_thread_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  const int64_t row = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (row >= l.rows.rows) return;
  int64_t off[Io::kOperands];
  outer.get(row, off);
  const Io io(l, off, l.rows.cols);
  S run = Op::identity();
  for (int64_t e = 0; e < l.rows.cols; ++e) {
    run = Op::combine(run, io.load(e));
    io.store(e, run);
  }
}

/// True when a thread per row serves better than blocks: short rows, or
/// strided rows whose neighbours are adjacent in memory (a warp then reads
/// 32 neighbouring rows at once).
inline bool thread_per_row(const ScanLaunch& l, int in) {
  const RowLaunch& r = l.rows;
  if (r.cols <= 32 && r.rows >= 256) return true;
  return r.inner.stride[in][0] != 1 && r.outer.rank >= 1 && r.outer.stride[in][0] == 1 && r.rows >= 2048;
}

template <class Io>
Status scan_on_cuda(const ScanLaunch& l, CUstream_st* stream) {
  static_assert(sizeof(typename Io::S) <= kMaxStateBytes, "the plan sizes the workspace for kMaxStateBytes");
  if (l.rows.rows == 0 || l.rows.cols == 0) return Status::ok();
  const OffsetCalc<Io::kOperands, int64_t> outer(l.rows.outer);
  if (thread_per_row(l, Io::probe(l))) {
    row_per_thread_kernel<Io><<<unsigned((l.rows.rows + 255) / 256), 256, 0, stream>>>(l, outer);
  } else if (l.split) {
    using S = typename Io::S;
    constexpr int64_t kT = kBlock * kPassItems<Io>;
    const int64_t tiles = (l.rows.cols + kT - 1) / kT;
    const int64_t blocks = l.rows.rows * tiles;
    if (blocks > int64_t(0x7fffffff)) return unsupported("scan: ", blocks, " tiles exceed the grid limit");
    if (kTicketBytes + TileStates<S>::bytes(2 * blocks) > l.workspace_bytes)
      return internal_error("scan: workspace of ", l.workspace_bytes, " bytes < ", kTicketBytes + TileStates<S>::bytes(2 * blocks));
    BARACUDA_CUDA_TRY(cudaMemsetAsync(l.workspace, 0, kTicketBytes + TileStates<S>::reset_bytes(2 * blocks), stream));
    if constexpr (Io::kStreams) {
      if (streams<Io>(l)) {
        static_assert(kStreamTile<Io::kInBytes> == kBlock * kPassItems<Io>, "the same tiles as the single-pass kernel");
        // A persistent grid of the blocks an SM holds (kStreamBlocks on sm_90; where fewer fit, the rest wait
        // their turn: tiles go by ticket, so no block waits on one that has not started).
        auto kernel = streamed_scan_kernel<Io>;
        constexpr size_t smem = kStreamSmem<Io::kInBytes>;
        BARACUDA_CUDA_TRY(rows::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(smem),
                                                   /*max_carveout=*/true));
        const int64_t resident = int64_t(kStreamBlocks<Io::kInBytes>) * current_sm_count();
        kernel<<<unsigned(std::min(blocks, resident)), kStreamThreads, smem, stream>>>(l, outer, tiles);
        BARACUDA_CUDA_TRY(cudaGetLastError());
        return Status::ok();
      }
    }
    single_pass_kernel<Io><<<unsigned(blocks), kBlock, 0, stream>>>(l, outer, tiles);
  } else {
    if (l.rows.rows > int64_t(0x7fffffff)) return unsupported("scan: ", l.rows.rows, " rows exceed the grid limit");
    tile_scan_kernel<Io><<<unsigned(l.rows.rows), kBlock, 0, stream>>>(l, outer);
  }
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::scan
