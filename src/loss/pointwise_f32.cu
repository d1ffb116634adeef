// CUDA pointwise losses for dtypes: float, double, run by the elementwise launcher
// (split so the build runs in parallel).
#include "elementwise/cuda_launcher.cuh"
#include "loss/register.hpp"

namespace baracuda::loss {
namespace {
[[maybe_unused]] const bool registered =
    register_pointwise<ew::CudaLauncher, false, TypeList<float, double>>(cuda_pointwise());
}  // namespace
}  // namespace baracuda::loss
