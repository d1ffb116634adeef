// CUDA pointwise losses for dtypes: __half, __nv_bfloat16, run by the elementwise launcher
// (split so the build runs in parallel).
#include "elementwise/cuda_launcher.cuh"
#include "loss/register.hpp"

namespace baracuda::loss {
namespace {
[[maybe_unused]] const bool registered =
    register_pointwise<ew::CudaLauncher, false, TypeList<__half, __nv_bfloat16>>(cuda_pointwise());
}  // namespace
}  // namespace baracuda::loss
