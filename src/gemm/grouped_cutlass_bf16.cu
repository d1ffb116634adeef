// The CUTLASS sm_90a grouped GEMM for bf16 (Note [CUTLASS grouped GEMM] in grouped_cutlass.cuh).
#include "gemm/grouped_cutlass.cuh"

namespace baracuda::gemm {
namespace {

const CutlassGroupedKernel kKernel{"cutlass_sm90_ptr_array_tma_wgmma_coop_128x256x64",
                                   &cutlass_grouped_impl::Launch<__nv_bfloat16>::workspace,
                                   &cutlass_grouped_impl::Launch<__nv_bfloat16>::run};
[[maybe_unused]] const bool registered = (cutlass_grouped().add(launch_key("grouped_mm", DType::bf16), &kKernel), true);

}  // namespace
}  // namespace baracuda::gemm
