// CUDA scans for dtypes: int8_t, uint8_t, int16_t, int32_t, int64_t, uint32_t, bool (split so the build runs in parallel).
#include "scan/kernels.cuh"
#include "scan/register.hpp"

namespace baracuda::scan {
namespace {
template <class Io>
struct CudaScan {
  static Status run(const ScanLaunch& l, CUstream_st* s) { return scan_on_cuda<Io>(l, s); }
};
[[maybe_unused]] const bool registered = register_scans<CudaScan, TypeList<int8_t, uint8_t, int16_t, int32_t, int64_t, uint32_t, bool>>(cuda_scans());
}  // namespace
}  // namespace baracuda::scan
