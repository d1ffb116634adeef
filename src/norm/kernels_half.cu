// CUDA normalization kernels for dtypes: __half, __nv_bfloat16 (split so the build runs in parallel).
#include "norm/kernels.cuh"
#include "norm/register.hpp"

namespace baracuda::norm {
namespace {
[[maybe_unused]] const bool registered = register_norms<CudaNorm, TypeList<__half, __nv_bfloat16>>(cuda_norms());
}  // namespace
}  // namespace baracuda::norm
