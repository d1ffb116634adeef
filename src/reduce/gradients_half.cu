// CUDA gradients of the reductions for dtypes: __half, __nv_bfloat16, run by the
// elementwise launcher (split so the build runs in parallel).
#include "elementwise/cuda_launcher.cuh"
#include "reduce/register.hpp"

namespace baracuda::red {
namespace {
[[maybe_unused]] const bool registered =
    register_gradients<ew::CudaLauncher, false, TypeList<__half, __nv_bfloat16>>(cuda_gradients());
}  // namespace
}  // namespace baracuda::red
