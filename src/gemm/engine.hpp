// What runs a bound GEMM problem for a plan: a launcher of the host or
// bespoke table, or cuBLASLt.
#pragma once

#include <memory>

#include "gemm/problem.hpp"

namespace baracuda::gemm {

class Engine {
 public:
  virtual ~Engine() = default;
  /// Whether this engine can run the problem's layouts; the reason if not.
  virtual Status supports(const Problem&) const { return Status::ok(); }
  /// Readies the engine for a problem (cuBLASLt: picks and caches the algorithm).
  virtual Status prepare(const Problem&) const { return Status::ok(); }
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

/// What a cuBLASLt engine is asked for.
struct LtRequest {
  DType in = DType::f32, out = DType::f32;
  bool tf32 = false;                  ///< f32 inputs multiplied in TF32
  Activation act = Activation::none;  ///< relu and gelu_tanh fuse; gelu and silu run after, in place
  bool bias = false;
  size_t max_workspace = 0;
};

/// A cuBLASLt engine, or why cuBLASLt cannot serve the request (dtype).
/// Defined only in CUDA builds.
Result<std::unique_ptr<Engine>> make_lt_engine(const LtRequest& request);

}  // namespace baracuda::gemm
