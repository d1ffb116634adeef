// Asynchronous global -> shared copies (cp.async, sm_80+; a plain 16-byte
// copy below), shared by the kernels that stage operands through shared
// memory (attention, the fused norm backward), and the mbarriers (sm_90)
// that the Hopper attention and the clustered norm backward wait on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace baracuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The "memory" clobbers keep the compiler from moving shared-memory reads of
// a stage across the copy into it or the wait for it.
/// 16 bytes to shared `dst`: the first `src_bytes` (0 to 16) from global
/// `src`, the rest zeros (0 reads nothing: pass any valid address then).
__device__ __forceinline__ void cp_async_16_zfill(void* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
#else
  for (int i = 0; i < 16; ++i)
    static_cast<char*>(dst)[i] = i < src_bytes ? static_cast<const char*>(src)[i] : char(0);
#endif
}
/// 16 bytes from global `src` to shared `dst`; `valid` false reads nothing
/// and zero-fills (pass any valid address as `src` then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  cp_async_16_zfill(dst, src, valid ? 16 : 0);
#else
  *static_cast<uint4*>(dst) = valid ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}
/// 4 bytes (4-byte aligned) from global `src` to shared `dst`, through L1.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
#else
  *static_cast<uint32_t*>(dst) = __ldg(static_cast<const uint32_t*>(src));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most kPending committed groups of this thread are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

/// Named barriers (ids 1..15; 0 is __syncthreads): `threads` (a multiple of
/// 32) in all take part, those that sync wait, those that arrive do not; the
/// shared-memory writes before an arrive are seen after the matching sync.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------- mbarriers (sm_90)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define BARACUDA_MBARRIERS 1
#endif

/// Initialises an mbarrier expecting `count` arrivals a phase (one thread).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef BARACUDA_MBARRIERS
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
/// Makes the initialised barriers visible to the other threads, the cluster's
/// blocks and the async proxy (before a block or cluster barrier).
__device__ __forceinline__ void mbar_fence_init() {
#ifdef BARACUDA_MBARRIERS
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/// One arrival (release: this thread's earlier writes are visible to the waiters).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef BARACUDA_MBARRIERS
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
/// One arrival that also announces `bytes` of asynchronous writes (TMA,
/// st_async_pair from the cluster's blocks) the phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef BARACUDA_MBARRIERS
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/// Waits (acquire) until the phase of parity `parity` is over.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef BARACUDA_MBARRIERS
  uint32_t done = 0;
#ifdef BARACUDA_MBAR_WATCHDOG  // debugging builds: a wait of more than ~2 s names itself and traps
  const long long start = clock64();
#endif
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#ifdef BARACUDA_MBAR_WATCHDOG
    if (!done && clock64() - start > 4000000000ll) {
      printf("mbar_wait stuck: block %d thread %d barrier %u parity %u\n", int(blockIdx.x), int(threadIdx.x), bar, parity);
      __trap();
    }
#endif
  } while (!done);
#endif
}

// ---------------------------------------------------------------- distributed shared memory (sm_90)
/// The cluster shared address of the variable that sits at shared address
/// `local` in this block, in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote = local;
#ifdef BARACUDA_MBARRIERS
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
#endif
  return remote;
}
/// Two values to cluster shared address `addr` (another block's shared
/// memory), counted as their bytes on the barrier at cluster address
/// `remote_bar` of that block: its waiters see the values once the phase
/// completes, with no fence in the sender (a release arrive costs a
/// MEMBAR.ALL.GPU, which waits on every store the thread has in flight).
template <class M>
__device__ __forceinline__ void st_async_pair(uint32_t addr, M a, M b, uint32_t remote_bar) {
#ifdef BARACUDA_MBARRIERS
  if constexpr (sizeof(M) == 8)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
                 "l"(__double_as_longlong(a)), "l"(__double_as_longlong(b)), "r"(remote_bar)
                 : "memory");
  else
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
                 "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(remote_bar)
                 : "memory");
#endif
}

}  // namespace baracuda
