// What runs a bound attention problem for a plan: a launcher of the host or
// bespoke CUDA table, or cuDNN's fused attention.
#pragma once

#include <memory>

#include "attention/problem.hpp"

namespace baracuda::attn {

class Engine {
 public:
  virtual ~Engine() = default;
  /// Whether this engine can run the problem (layout, options, sizes); the
  /// reason if not, as `unsupported`. No CUDA call.
  virtual Status supports(const Problem&) const { return Status::ok(); }
  /// Readies the engine for a problem's layout (cuDNN: builds and caches the graph).
  virtual Status prepare(const Problem&) const { return Status::ok(); }
  virtual Status run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const = 0;
  /// Scratch bytes `run` needs for the problem.
  virtual size_t workspace(const Problem&) const { return 0; }
};

/// Forward and backward launchers of the host reference and the bespoke CUDA
/// kernels, keyed "attention:dtype" and "attention_backward:dtype".
using AttentionFn = Status (*)(const Problem&, const Workspace&, CUstream_st*);
using AttentionTable = LaunchTable<AttentionFn>;
AttentionTable& host_attention();
AttentionTable& cuda_attention();
/// Scratch bytes of the bespoke CUDA launchers on a device of compute
/// capability `sm` with `max_smem` bytes of opt-in shared memory: the
/// backward's per-row dO . O, and the one-pass backward's f32 dQ sums.
size_t cuda_attention_workspace(const Problem& p, int sm, size_t max_smem);

/// Largest absolute errors of the Hopper forward's two warpgroup products
/// against exact sums on small integers (0 when right): S = A B^T (shared
/// memory descriptors, K-major) and O = P C (P from registers, C N-major).
struct WgmmaCheck {
  double scores = 0, output = 0;
};
/// Runs that check on the current device (sm_90, a build with sm_90a code),
/// so that a descriptor or fragment bug shows apart from the softmax.
/// Defined only in CUDA builds.
Result<WgmmaCheck> wgmma_self_test(DType dtype, int head_dim);

/// Largest absolute errors of the one-pass Hopper backward's products
/// against exact sums on small integers (0 when right): dK = dS^T Q (dS^T
/// in registers, Q N-major) and the dQ parts dS K (a stored dS^T tile read
/// M-major, K N-major), with the kernel's own issue functions. Runs on the
/// current device (sm_90, sm_90a code); defined only in CUDA builds.
struct WgmmaBackwardCheck {
  double grad_k = 0, grad_q = 0;
};
Result<WgmmaBackwardCheck> wgmma_backward_self_test(DType dtype);

/// Bytes of one 128-row K tile (batch 1, head 2, rows 128.. of a [2, 3, 200,
/// D] tensor; rows past 200 zero) that differ from the 128-byte swizzled
/// image the wgmma descriptors expect, loaded by TMA with the forward's
/// tensor map and by the cp.async path (0 when right): a tensor-map bug
/// shows here apart from a barrier bug. Defined only in CUDA builds.
struct TmaCheck {
  int64_t tma_bytes = 0, cp_async_bytes = 0;
};
Result<TmaCheck> tma_self_test(DType dtype, int head_dim);

/// cuDNN's fused flash attention through the cuDNN frontend graph API
/// (f16/bf16), forward or backward, or why it cannot serve. `deterministic`:
/// the backward must be bitwise reproducible run to run. Defined only in CUDA builds.
/// Every engine shares one cache of built graphs (process-wide, keyed by
/// layout, options and device); `cudnn_graphs_built` counts its entries.
Result<std::unique_ptr<Engine>> make_cudnn_engine(bool backward, bool deterministic);
size_t cudnn_graphs_built();

}  // namespace baracuda::attn
