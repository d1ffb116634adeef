// cuDNN: error mapping (backend statuses and the frontend's error_t), the
// per-device handle and the mutex that guards its stream. Only for
// translation units built with cuDNN (BARACUDA_HAS_CUDNN).
#pragma once

#include <cudnn.h>

#include <mutex>
#include <string_view>

#include "core/errors.hpp"

namespace baracuda::vendor {

Status cudnn_status(cudnnStatus_t status, const char* expr, const char* file, int line);
#define BARACUDA_CUDNN_TRY(expr) BARACUDA_TRY(::baracuda::vendor::cudnn_status((expr), #expr, __FILE__, __LINE__))

/// A failed cuDNN frontend call: `refused` (the graph is not supported, no
/// plan or heuristic serves it) becomes `unsupported`, anything else a
/// backend error of library "cudnn_frontend".
Status frontend_failure(bool refused, int code, std::string_view code_name, std::string_view message, const char* expr,
                        const char* file, int line);

/// Maps a cudnn_frontend::error_t. A template so that this header need not
/// include the (heavy) frontend: it is instantiated where the frontend is.
template <class FeError>
Status frontend_status(const FeError& err, const char* expr, const char* file, int line) {
  if (err.is_good()) return Status::ok();
  using Code = decltype(err.code);
  const char* name = "error";
  switch (err.code) {
    case Code::ATTRIBUTE_NOT_SET: name = "ATTRIBUTE_NOT_SET"; break;
    case Code::SHAPE_DEDUCTION_FAILED: name = "SHAPE_DEDUCTION_FAILED"; break;
    case Code::INVALID_TENSOR_NAME: name = "INVALID_TENSOR_NAME"; break;
    case Code::INVALID_VARIANT_PACK: name = "INVALID_VARIANT_PACK"; break;
    case Code::GRAPH_NOT_SUPPORTED: name = "GRAPH_NOT_SUPPORTED"; break;
    case Code::GRAPH_EXECUTION_PLAN_CREATION_FAILED: name = "GRAPH_EXECUTION_PLAN_CREATION_FAILED"; break;
    case Code::GRAPH_EXECUTION_FAILED: name = "GRAPH_EXECUTION_FAILED"; break;
    case Code::HEURISTIC_QUERY_FAILED: name = "HEURISTIC_QUERY_FAILED"; break;
    case Code::CUDA_API_FAILED: name = "CUDA_API_FAILED"; break;
    case Code::CUDNN_BACKEND_API_FAILED: name = "CUDNN_BACKEND_API_FAILED"; break;
    case Code::INVALID_VALUE: name = "INVALID_VALUE"; break;
    default: break;
  }
  const bool refused = err.code == Code::GRAPH_NOT_SUPPORTED || err.code == Code::GRAPH_EXECUTION_PLAN_CREATION_FAILED ||
                       err.code == Code::HEURISTIC_QUERY_FAILED;
  return frontend_failure(refused, static_cast<int>(err.code), name, err.err_msg, expr, file, line);
}
#define BARACUDA_CUDNN_FE_TRY(expr) \
  BARACUDA_TRY(::baracuda::vendor::frontend_status((expr), #expr, __FILE__, __LINE__))

/// The process's cuDNN handle for the current device, created on first use
/// (which needs the device), and the mutex to hold while setting its stream
/// and enqueuing work on it: one handle serves every thread.
struct DnnHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex* mutex = nullptr;
};
Result<DnnHandle> dnn_handle();

/// The loaded cuDNN library's version (e.g. 91400 for 9.14.0); no device needed.
int dnn_version();

}  // namespace baracuda::vendor
