// CUDA normalization forwards for dtypes: __nv_fp8_e4m3, __nv_fp8_e5m2 (no gradients; split so the build runs in parallel).
#include "norm/kernels.cuh"
#include "norm/register.hpp"

namespace baracuda::norm {
namespace {
[[maybe_unused]] const bool registered = register_norms<CudaNorm, Fp8Types>(cuda_norms());
}  // namespace
}  // namespace baracuda::norm
