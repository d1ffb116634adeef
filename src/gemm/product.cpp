// ProductStep: a GEMM for other families' plans (Note [Product steps]), and
// table_engine: a plan's host-reference or bespoke launcher as an engine;
// product_sku: the sku every product plan starts from.
#include "core/errors.hpp"
#include "core/family.hpp"
#include "gemm/engine.hpp"

namespace baracuda::gemm {

Result<std::unique_ptr<Engine>> table_engine(Backend backend, const std::string& key, const std::string& what) {
  const GemmTable& table = backend == Backend::host_reference ? host_gemms() : cuda_gemms();
  GemmFn fn = table.find(key);
  if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", what);
  return std::unique_ptr<Engine>(std::make_unique<TableEngine>(fn));
}

Result<std::unique_ptr<Engine>> table_engine(Backend backend, DType in, DType out) {
  return table_engine(backend, launch_key("gemm", in, out), cat("GEMM ", dtype_name(in), " -> ", dtype_name(out)));
}

KernelSku product_sku(const char* op, DType in, DType out, Backend backend) {
  KernelSku sku = bespoke_sku(OpCategory::gemm, op, in, backend);
  if (out != in) sku.aux_element = out;
  if (!is_floating(in)) {
    sku.precision.math = MathPrecision::exact;
    sku.precision.accumulator = backend == Backend::cublaslt ? DType::i32 : DType::i64;
  }
  return sku;
}

Result<ProductStep> ProductStep::make(const TensorView& d, const TensorView& a, const TensorView& b) {
  ProductStep step;
  step.bespoke_ = cuda_gemms().find(launch_key("gemm", a.dtype, d.dtype));
  if (!step.bespoke_ || b.dtype != a.dtype)
    return unsupported("no CUDA GEMM for ", dtype_name(a.dtype), " x ", dtype_name(b.dtype), " -> ", dtype_name(d.dtype));
#ifdef BARACUDA_HAS_CUDA
  auto probe = bind_product(d, a, b, d);
  if (!probe) return probe.status();
  probe->beta = 1;
  LtRequest request;
  request.in = a.dtype, request.out = d.dtype, request.max_workspace = kLtWorkspace;
  if (auto lt = make_lt_engine(request, std::span(&*probe, 1))) step.lt_ = std::move(*lt);
#endif
  return step;
}

Status ProductStep::run(const TensorView& d, const TensorView& a, const TensorView& b, double beta,
                        const Workspace& workspace, CUstream_st* stream) const {
  auto p = bind_product(d, a, b, d);
  if (!p) return p.status();
  p->beta = beta;
  if (lt_ && lt_->supports(*p).is_ok()) return lt_->run(*p, workspace, stream);
  return bespoke_(*p, stream);
}

}  // namespace baracuda::gemm
