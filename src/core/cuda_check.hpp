// Wraps CUDA runtime calls: failures become BackendError statuses that record
// the expression, file and line.
#pragma once

#include <cuda_runtime_api.h>

#include "core/errors.hpp"

namespace baracuda {

inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  return Status::backend("cudart", static_cast<long>(err),
                         cat(expr, " failed at ", file, ":", line, ": ", cudaGetErrorName(err), " (",
                             cudaGetErrorString(err), ")"));
}

#define BARACUDA_CUDA_TRY(expr) BARACUDA_TRY(::baracuda::cuda_status((expr), #expr, __FILE__, __LINE__))

/// Compute capability (major*10+minor) of the current device; 0 if none.
int current_sm_version();
/// Streaming multiprocessors of the current device (0 without CUDA).
int current_sm_count();
/// Shared memory a block of the current device may opt in to (48 KiB when
/// the driver cannot say).
size_t current_optin_smem();

}  // namespace baracuda
