// CUDA softmax family for dtypes: double, __nv_fp8_e4m3, __nv_fp8_e5m2 (split so the build runs in parallel).
#include "softmax/kernels.cuh"
#include "softmax/register.hpp"

namespace baracuda::smax {
namespace {
[[maybe_unused]] const bool registered = register_softmax<CudaSoftmax, TypeList<double, __nv_fp8_e4m3, __nv_fp8_e5m2>>(cuda_softmax());
}  // namespace
}  // namespace baracuda::smax
