// ProductStep: a GEMM for other families' plans (Note [Product steps]).
#include "core/errors.hpp"
#include "gemm/engine.hpp"

namespace baracuda::gemm {

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
