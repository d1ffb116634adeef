#include "baracuda/core.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <mutex>

#include "core/cuda_check.hpp"
#endif

namespace baracuda {

#ifdef BARACUDA_HAS_CUDA
bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

int current_sm_version() {
  static int versions[64] = {};
  static std::once_flag once[64];
  int device = 0;
  if (!cuda_available() || cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  std::call_once(once[device], [device] {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) versions[device] = prop.major * 10 + prop.minor;
  });
  return versions[device];
}

int current_sm_count() {
  static int counts[64] = {};
  static std::once_flag once[64];
  int device = 0;
  if (!cuda_available() || cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  std::call_once(once[device], [device] {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) counts[device] = n;
  });
  return counts[device];
}

size_t current_optin_smem() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 48 * 1024;
  }
  return size_t(bytes);
}
#else
bool cuda_available() { return false; }
#endif

}  // namespace baracuda
