// CUDA class losses (cross_entropy, nll_loss) for dtypes: __half, __nv_bfloat16.
#include "loss/kernels.cuh"
#include "loss/register.hpp"

namespace baracuda::loss {
namespace {
template <class L, class T, class Index>
struct CudaClassLoss {
  static Status run(const ClassLaunch& cl, const ClassParams& p, CUstream_st* s) { return class_loss_on_cuda<L, T, Index>(cl, p, s); }
};
[[maybe_unused]] const bool registered = register_class_losses<CudaClassLoss, TypeList<__half, __nv_bfloat16>>(cuda_class_losses());
}  // namespace
}  // namespace baracuda::loss
