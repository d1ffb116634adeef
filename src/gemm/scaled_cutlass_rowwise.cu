// scaled_mm's CUTLASS sm_90a kernels for row-wise scales (Note [scaled_mm on CUTLASS] in scaled_cutlass.cuh).
#include "gemm/scaled_cutlass.cuh"

namespace baracuda::gemm {
namespace {

constexpr const char* kNames[3] = {"cutlass_sm90_fp8_rowwise_coop_128x128x128_bf16",
                                   "cutlass_sm90_fp8_rowwise_coop_128x128x128_f16",
                                   "cutlass_sm90_fp8_rowwise_coop_128x128x128_f32"};
[[maybe_unused]] const bool registered = cutlass_scaled_impl::register_kernels<false>(kNames);

}  // namespace
}  // namespace baracuda::gemm
