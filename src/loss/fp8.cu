// CUDA losses for fp8 storage (__nv_fp8_e4m3, __nv_fp8_e5m2): the pointwise,
// class and row losses themselves, computed in f32; no gradients
// (register.hpp; check_float_storage in core/family.hpp).
#include "elementwise/cuda_launcher.cuh"
#include "loss/kernels.cuh"
#include "loss/kernels_row.cuh"
#include "loss/register.hpp"

namespace baracuda::loss {
namespace {
template <class L, class T, class Index>
struct CudaClassLoss {
  static Status run(const ClassLaunch& cl, const ClassParams& p, CUstream_st* s) { return class_loss_on_cuda<L, T, Index>(cl, p, s); }
};
template <class L, class T, class Index>
struct CudaRowLoss {
  static Status run(const RowLossLaunch& rl, const RowParams& p, CUstream_st* s) { return row_loss_on_cuda<L, T, Index>(rl, p, s); }
};
[[maybe_unused]] const bool registered = register_pointwise<ew::CudaLauncher, false, Fp8Types>(cuda_pointwise()) &&
                                         register_class_losses<CudaClassLoss, Fp8Types>(cuda_class_losses()) &&
                                         register_row_losses<CudaRowLoss, Fp8Types>(cuda_row_losses());
}  // namespace
}  // namespace baracuda::loss
