// What runs a bound GEMM problem for a plan: a launcher of the host or
// bespoke table, or cuBLASLt.
#pragma once

#include <memory>
#include <span>

#include "gemm/problem.hpp"

namespace baracuda::gemm {

class Engine {
 public:
  virtual ~Engine() = default;
  /// Whether this engine can run the problem's layouts; the reason if not.
  virtual Status supports(const Problem&) const { return Status::ok(); }
  virtual Status run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const = 0;
  /// Exact scratch bytes `run` may use.
  virtual size_t workspace() const { return 0; }
};

class TableEngine final : public Engine {
 public:
  explicit TableEngine(GemmFn fn) : fn_(fn) {}
  Status run(const Problem& p, const Workspace&, CUstream_st* stream) const override { return fn_(p, stream); }

 private:
  GemmFn fn_;
};

/// The host-reference or bespoke CUDA launcher registered under `key`, as an
/// engine; `what` names the kernel in the refusal.
Result<std::unique_ptr<Engine>> table_engine(Backend backend, const std::string& key, const std::string& what);
/// The same for the products `in` -> `out` ("gemm:in:out").
Result<std::unique_ptr<Engine>> table_engine(Backend backend, DType in, DType out);

/// The sku of a plan of products `in` -> `out` on `backend` (before the
/// engine's own marks: TF32, cuBLASLt's row-major layout, epilogues): the
/// bespoke sku, exact integer math (i32 accumulation on cuBLASLt, i64 elsewhere).
KernelSku product_sku(const char* op, DType in, DType out, Backend backend);

/// What a cuBLASLt engine is asked for.
struct LtRequest {
  DType in = DType::f32, out = DType::f32;
  DType in_b = DType::f32;            ///< B's dtype; differs from `in` only when scaled
  bool scaled = false;                ///< scaled_mm: fp8 A and B with per-tensor scales
  bool outer_scales = false;          ///< scaled_mm: row-wise scales (cuBLASLt's OUTER_VEC_32F)
  bool result_scale = false;          ///< scaled_mm: an fp8 D scaled by scale_result (D_SCALE_POINTER)
  bool fast_accum = false;            ///< fp8: cuBLASLt's fast accumulation (torch's use_fast_accum)
  bool tf32 = false;                  ///< f32 inputs multiplied in TF32
  Activation act = Activation::none;  ///< relu and gelu_tanh fuse; gelu and silu run after, in place
  bool bias = false;
  DType bias_dtype = DType::f32;
  bool bias_grad = false;  ///< problems may carry bias_grad (the BGRADA/BGRADB epilogue)
  size_t max_workspace = 0;  ///< the cap of the heuristics' request
};

/// A cuBLASLt engine readied for `probes` (the descriptor's problems over
/// contiguous views), or why cuBLASLt cannot serve them. Its workspace() is
/// the most the algorithms picked for the probes need (at most
/// max_workspace); algorithms for other layouts met later are picked within
/// that amount. Defined only in CUDA builds.
Result<std::unique_ptr<Engine>> make_lt_engine(const LtRequest& request, std::span<const Problem> probes);

/// cuBLASLt's scratch: its heuristics pick from algorithms needing at most
/// this (a plan's workspace is what the picked ones need).
inline constexpr size_t kLtWorkspace = size_t(32) << 20;

/// Note [Product steps]
/// A GEMM that a plan of another family runs inside its own loop, over 2-D
/// views bound at each run: D = A @ B + beta * D, A and B of one dtype, D of
/// that dtype or f32 for f16/bf16 (to sum products across calls in f32).
/// cuBLASLt runs the views it takes, the bespoke kernel the others (any
/// strides). Fixed summation order, no atomics; run neither allocates nor
/// synchronises (capturable).
class ProductStep {
 public:
  /// Readied for views laid out as `d`, `a` and `b` (data may be null).
  static Result<ProductStep> make(const TensorView& d, const TensorView& a, const TensorView& b);
  Status run(const TensorView& d, const TensorView& a, const TensorView& b, double beta, const Workspace& workspace,
             CUstream_st* stream) const;
  /// Exact scratch bytes `run` may use.
  size_t workspace() const { return lt_ ? lt_->workspace() : 0; }

 private:
  std::unique_ptr<const Engine> lt_;  ///< null: cuBLASLt is not built in or refused the dtypes
  GemmFn bespoke_ = nullptr;
};

/// Whether cuBLASLt can fold a bias gradient (over M, summed over K) into
/// the problem's GEMM: one non-empty call, no batch or reduction loop, no addend.
inline bool lt_can_fuse_bias_grad(const Problem& p) {
  return p.batch_count() == 1 && p.red_count() == 1 && !p.reads_c() && p.m > 0 && p.n > 0 && p.k > 0;
}

}  // namespace baracuda::gemm
