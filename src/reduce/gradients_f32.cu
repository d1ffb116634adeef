// CUDA gradients of the reductions for dtypes: float, double, run by the
// elementwise launcher (split so the build runs in parallel).
#include "elementwise/cuda_launcher.cuh"
#include "reduce/register.hpp"

namespace baracuda::red {
namespace {
[[maybe_unused]] const bool registered =
    register_gradients<ew::CudaLauncher, false, TypeList<float, double>>(cuda_gradients());
}  // namespace
}  // namespace baracuda::red
