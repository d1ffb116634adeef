// CUDA softmax family for dtypes: __half, __nv_bfloat16 (split so the build runs in parallel).
#include "softmax/kernels.cuh"
#include "softmax/register.hpp"

namespace baracuda::smax {
namespace {
[[maybe_unused]] const bool registered = register_softmax<CudaSoftmax, TypeList<__half, __nv_bfloat16>>(cuda_softmax());
}  // namespace
}  // namespace baracuda::smax
