// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the attention forward
// (kernels_fwd_sm90.cu) and backward (kernels_bwd_sm90.cu): tiles of
// 16-byte chunks copied by cp.async into the 128-byte swizzled shared-memory
// layout, the matrix descriptors that describe it, and the products: S =
// Q K^T with both operands in shared memory (m64n128k16; the backward's
// m64n64k16, and with A M-major or B N-major: wgmma_ss) and O += P V with P
// in registers (m64n64k16 / m64n128k16, V read N-major); the
// warp-specialisation pieces: mbarriers, TMA tile loads, named barriers and
// setmaxnreg; and bulk f32 reductions from shared into global memory.
//
// Note [Swizzled tiles and descriptors]
// A tile of R rows by kD halves is stored as kD / 64 column blocks of R
// rows of 128 bytes (64 halves); in each 1024-byte group of 8 rows the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte swizzle,
// Swizzle<3,4,3>: address bits [4:6] ^= bits [7:9]); tiles start on 1024
// bytes so the matrix base offset is 0. One layout serves every operand:
// - K-major (Q as A, K as B, transpose 0): rows are M or N, 16 halves of K
//   a step are 32 bytes on within the 128-byte row (the hardware swizzles
//   the absolute address), the next 64 halves of K are the next column
//   block; SBO = 1024 (8 rows to the next 8), LBO unused (1).
// - N-major (V as B, transpose 1): rows are K (keys), the 64 halves of a
//   row are N (dims); 16 keys a step are 2048 bytes on; SBO = 1024 (8 keys
//   to the next 8), LBO = R * 128 (from dims 0..63 to dims 64..127).
// - M-major (A transposed, the backward's dS from a stored dS^T): as
//   N-major with M for N; M of 64 exactly (a 32-wide half of a 128-byte
//   row is not one of the canonical layouts of this swizzle; not tried).
// Fragments (PTX ISA, wgmma .m64nNk16): warp w of the warpgroup holds rows
// 16 w .. 16 w + 15; lane t holds accumulator register 4 i + e (kept here as
// d[i][e]) at row t / 4 + 8 (e / 2) and column 8 i + 2 (t % 4) + (e % 2); the A fragment from registers is
// mma.sync's m16n8k16 A fragment: {(g, 2q..), (g + 8, 2q..), (g, 2q + 8..),
// (g + 8, 2q + 8..)} for g = t / 4, q = t % 4, two halves a register.
#pragma once

#include "attention/device.cuh"

namespace baracuda::attn {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BARACUDA_WGMMA 1
#endif

/// Byte offset of 16-byte chunk `c` (of kD / 8) of row `r` in a swizzled tile of `rows` rows.
__host__ __device__ inline uint32_t swizzled_chunk(int rows, int r, int c) {
  return uint32_t((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4));
}

/// Issues the cp.async copy of `kRowsT` rows of kD halves (unit dim stride,
/// 16-byte rows) into a swizzled tile, rows at or past `len` and columns at
/// or past `cols` (a multiple of 8: a head dim padded to kD) zero-filled;
/// kThreadsT threads share it, consecutive threads taking consecutive
/// chunks. A thread keeps one chunk column, rows a multiple of 8 apart, so
/// its swizzled offset and its source step by constants.
template <int kD, int kRowsT, int kThreadsT, class T>
__device__ __forceinline__ void issue_swizzled(T* s, const T* base, int64_t seq, int64_t row0, int64_t len,
                                               int cols = kD) {
  constexpr int kPerRow = kD / 8, kRowStep = kThreadsT / kPerRow;
  static_assert(kThreadsT % kPerRow == 0 && kRowStep % 8 == 0 && kRowsT % kRowStep == 0,
                "a thread's chunks share a column and a swizzle");
  const int t = threadIdx.x % kThreadsT, c = t % kPerRow, r0 = t / kPerRow;
  unsigned char* dst = reinterpret_cast<unsigned char*>(s) + swizzled_chunk(kRowsT, r0, c);
  const T* src = base + (row0 + r0) * seq + c * 8;
#pragma unroll
  for (int k = 0; k < kRowsT / kRowStep; ++k) {
    const bool inside = row0 + r0 + k * kRowStep < len && c * 8 < cols;
    cp_async_16(dst + k * kRowStep * 128, inside ? src + k * kRowStep * seq : base, inside);
  }
}

/// The first 1024-byte boundary of shared memory at or after `raw`: where tiles in the
/// 128-byte swizzle start (the plans count the slack in the dynamic shared memory).
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* raw) {
  return raw + ((1024 - (shared_address(raw) & 1023)) & 1023);
}

/// A wgmma shared-memory matrix descriptor with the 128-byte swizzle (Note [Swizzled tiles and descriptors]).
__device__ __forceinline__ uint64_t sw128_desc(const void* start, uint32_t lbo_bytes) {
  return uint64_t((shared_address(start) & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

/// sw128_desc of the matrix `bytes` (a multiple of 16) on from the one
/// `desc` describes: the start address is the descriptor's low 14 bits
/// (address / 16; shared addresses are below 2^18), so a 32-bit add on the
/// low word carries into no other field. One add a product instead of the
/// address, masks and shifts again (~10 instructions a wgmma in the
/// backward's issue loops).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t low = uint32_t(desc) + (bytes >> 4);
  return (desc >> 32 << 32) | low;
}

/// Makes this thread's generic-proxy shared-memory writes (cp.async) visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef BARACUDA_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/// Orders this warpgroup's register writes before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() {
#ifdef BARACUDA_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef BARACUDA_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/// Waits until at most kPending committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef BARACUDA_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// Pins registers in place for the asynchronous MMA: before wgmma_fence, so
/// that every write of them precedes the fence; after wgmma_wait, so that no
/// read moves above the wait (register dependencies alone allow both moves).
template <int kN>
__device__ __forceinline__ void wgmma_pin(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
template <int kN>
__device__ __forceinline__ void wgmma_pin(uint32_t (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(d[i][e])::"memory");
}

#define BCD_WG_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define BCD_WG_D64                                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define BCD_WG_F1(d, i) "+f"(d[(i) / 4][(i) % 4])
#define BCD_WG_F8(d, i)                                                                                        \
  BCD_WG_F1(d, i), BCD_WG_F1(d, i + 1), BCD_WG_F1(d, i + 2), BCD_WG_F1(d, i + 3), BCD_WG_F1(d, i + 4),           \
      BCD_WG_F1(d, i + 5), BCD_WG_F1(d, i + 6), BCD_WG_F1(d, i + 7)
#define BCD_WG_F32(d) BCD_WG_F8(d, 0), BCD_WG_F8(d, 8), BCD_WG_F8(d, 16), BCD_WG_F8(d, 24)
#define BCD_WG_F64(d) BCD_WG_F32(d), BCD_WG_F8(d, 32), BCD_WG_F8(d, 40), BCD_WG_F8(d, 48), BCD_WG_F8(d, 56)

// d (64 x 128, f32) = A B (+ d when `accumulate`): A (64 x 16) and B (16 x 128) in shared memory,
// K-major or (kTransA, kTransB = 1) M- / N-major.
#define BCD_WGMMA_SS128(TY)                                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                    \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " BCD_WG_D64                          \
               ", %64, %65, p, 1, 1, %67, %68;\n}\n"                                                             \
               : BCD_WG_F64(d)                                                                                \
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB))
// d (64 x 64, f32) = A B (+ d when `accumulate`): A (64 x 16) and B (16 x 64) in shared memory, as above.
#define BCD_WGMMA_SS64(TY)                                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                    \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " BCD_WG_D32                           \
               ", %32, %33, p, 1, 1, %35, %36;\n}\n"                                                             \
               : BCD_WG_F32(d)                                                                                \
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB))
// d (64 x N, f32) += A B: A (64 x 16) from registers, B (16 x N) N-major in shared memory.
#define BCD_WGMMA_RS64(TY)                                                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " BCD_WG_D32                           \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                   \
               : BCD_WG_F32(d)                                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define BCD_WGMMA_RS128(TY)                                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " BCD_WG_D64                          \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                   \
               : BCD_WG_F64(d)                                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

/// d (64 x 128) = A B (+ d when `accumulate`), A and B in shared memory
/// (descriptors a, b): K-major, or M-major (kTransA) and N-major (kTransB).
template <class T, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
#ifdef BARACUDA_WGMMA
  if constexpr (std::is_same_v<T, __half>) BCD_WGMMA_SS128("f16");
  else BCD_WGMMA_SS128("bf16");
#endif
}

/// d (64 x 64) = A B (+ d when `accumulate`), as wgmma_ss_n128.
template <class T, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
#ifdef BARACUDA_WGMMA
  if constexpr (std::is_same_v<T, __half>) BCD_WGMMA_SS64("f16");
  else BCD_WGMMA_SS64("bf16");
#endif
}

/// d (64 x kN) = A B (+ d when `accumulate`), as wgmma_ss_n128, N of 64 or 128.
template <class T, int kN, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 8][4], uint64_t a, uint64_t b, int accumulate) {
  static_assert(kN == 64 || kN == 128, "wgmma_ss: N of 64 or 128");
  if constexpr (kN == 64) wgmma_ss_n64<T, kTransA, kTransB>(d, a, b, accumulate);
  else wgmma_ss_n128<T, kTransA, kTransB>(d, a, b, accumulate);
}

/// d (64 x kN) += A B, A (64 x 16) a register fragment, B N-major in shared memory (descriptor b).
template <class T, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4], uint64_t b) {
#ifdef BARACUDA_WGMMA
  static_assert(kN == 64 || kN == 128, "wgmma_rs: N of 64 or 128");
  if constexpr (kN == 64) {
    if constexpr (std::is_same_v<T, __half>) BCD_WGMMA_RS64("f16");
    else BCD_WGMMA_RS64("bf16");
  } else {
    if constexpr (std::is_same_v<T, __half>) BCD_WGMMA_RS128("f16");
    else BCD_WGMMA_RS128("bf16");
  }
#endif
}

#undef BCD_WGMMA_SS128
#undef BCD_WGMMA_SS64
#undef BCD_WGMMA_RS64
#undef BCD_WGMMA_RS128
#undef BCD_WG_F64
#undef BCD_WG_F32
#undef BCD_WG_F8
#undef BCD_WG_F1
#undef BCD_WG_D64
#undef BCD_WG_D32

/// Issues S = Q K^T for one warpgroup (no fence, commit or wait): sQ is this
/// warpgroup's 64 rows inside a swizzled tile of `q_rows` rows, sK a
/// swizzled tile of 128 keys; kD / 16 steps.
template <class T, int kD>
__device__ __forceinline__ void wgmma_scores_issue(float (&s)[16][4], const T* sQ, int q_rows, const T* sK) {
  const uint64_t a = sw128_desc(sQ, 16), b = sw128_desc(sK, 16);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int col = (kk % 4) * 16;  // halves into the 128-byte row of column block kk / 4
    wgmma_ss_n128<T>(s, desc_plus(a, uint32_t(((kk / 4) * q_rows * 64 + col) * sizeof(T))),
                     desc_plus(b, ((kk / 4) * 128 * 64 + col) * sizeof(T)), kk > 0);
  }
}

/// P (64 x 128 keys, the probabilities in the score accumulator layout) as
/// eight A fragments of 16 keys.
template <class T>
__device__ __forceinline__ void pack_probs(uint32_t (&a)[8][4], const float (&s)[16][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

/// Issues O += P V for one warpgroup (no fence, commit or wait): P as
/// pack_probs' fragments, V a swizzled tile of 128 keys by kD dims.
template <class T, int kD>
__device__ __forceinline__ void wgmma_values_issue(float (&o)[kD / 8][4], const uint32_t (&a)[8][4], const T* sV) {
  const uint64_t b = sw128_desc(sV, 128 * 128);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_rs<T, kD>(o, a[kk], desc_plus(b, kk * 16 * 64 * sizeof(T)));
}

/// S = Q K^T for one warpgroup, waited for (wgmma_scores_issue's operands).
template <class T, int kD>
__device__ __forceinline__ void wgmma_scores(float (&s)[16][4], const T* sQ, int q_rows, const T* sK) {
  wgmma_fence();
  wgmma_scores_issue<T, kD>(s, sQ, q_rows, sK);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(s);
}

/// O += P V for one warpgroup, waited for: P (64 x 128 keys) the
/// probabilities in the score accumulator layout, V a swizzled tile of 128
/// keys by kD dims.
template <class T, int kD>
__device__ __forceinline__ void wgmma_values(float (&o)[kD / 8][4], const float (&s)[16][4], const T* sV) {
  uint32_t a[8][4];  // all written before the fence
  pack_probs<T>(a, s);
  wgmma_pin(a);
  wgmma_pin(o);
  wgmma_fence();
  wgmma_values_issue<T, kD>(o, a, sV);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(o);
}

// ---------------------------------------------------------------- warp specialisation
// Note [mbarriers and TMA]
// An mbarrier (8 bytes of shared memory) completes a phase when its pending
// arrivals reach 0 and the bytes announced with arrive.expect_tx have all
// landed (TMA's complete_tx counts them down); it then starts the next phase
// with the arrival count of its init. try_wait.parity(P) returns once the
// phase of parity P is over: waiting for parity 1 on a fresh barrier (phase
// 0 running) returns at once, which lets a producer's first pass over an
// "empty" barrier through. A consumer of the n-th use of a ring stage waits
// for "full" parity n & 1, the producer of it for "empty" parity (n & 1) ^ 1.
// TMA writes through the async proxy, as wgmma reads, so the barrier alone
// orders them; generic writes (cp.async) need fence.proxy.async first.
// The mbarrier helpers (mbar_init, mbar_expect_tx, mbar_wait, ...) live in
// core/cuda_async.cuh, shared with the clustered norm backward.

/// TMA: the box at coordinates (c0 innermost .. c3) of the 4-d tensor map
/// `map` (a __grid_constant__ kernel parameter) into shared `dst`, counted on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, int c0, int c1, int c2, int c3, uint32_t bar) {
#ifdef BARACUDA_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}
/// TMA: kRows rows from `row` of head `head` of batch `b` (a map of boxes of
/// 64 dims by kRows rows, make_tensor_map) into the swizzled tile at `dst`,
/// its kD / 64 column blocks one after another (issue_swizzled's layout).
template <int kD, int kRows, class T>
__device__ __forceinline__ void tma_load_rows(T* dst, const void* map, int64_t row, int64_t head, int64_t b,
                                              uint32_t bar) {
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb)
    tma_load_4d(dst + cb * kRows * 64, map, 64 * cb, int(row), int(head), int(b), bar);
}
/// Fetches a tensor map into the TMA unit's cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch(const void* map) {
#ifdef BARACUDA_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#endif
}

/// Adds `bytes` (a multiple of 16) of f32 from shared `src` into global `dst`
/// (both 16-byte aligned) through the TMA unit, in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
#ifdef BARACUDA_WGMMA
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(shared_address(src)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef BARACUDA_WGMMA
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most kPending of this thread's bulk groups still read their shared-memory source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#ifdef BARACUDA_WGMMA
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// Waits until at most kPending of this thread's bulk groups are in flight.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
#ifdef BARACUDA_WGMMA
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

/// Lowers (producer) or raises (consumer) this warpgroup's registers a thread; every warp of it calls it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef BARACUDA_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef BARACUDA_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace baracuda::attn
