// cuBLASLt: error mapping, the per-device handle and RAII descriptors.
#pragma once

#include <cublasLt.h>

#include <memory>

#include "core/errors.hpp"

namespace baracuda::vendor {

Status cublas_status(cublasStatus_t status, const char* expr, const char* file, int line);
#define BARACUDA_CUBLAS_TRY(expr) BARACUDA_TRY(::baracuda::vendor::cublas_status((expr), #expr, __FILE__, __LINE__))

/// The process's cuBLASLt handle for the current device, created on first use.
Result<cublasLtHandle_t> lt_handle();

/// Owns a cuBLASLt descriptor.
template <class T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const { (void)Destroy(p); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using MatrixLayout =
    std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using MatmulPreference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                                         LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

/// Sets one attribute of a descriptor from a value of the attribute's type.
template <class Setter, class Desc, class Attr, class V>
cublasStatus_t set_attr(Setter setter, Desc desc, Attr attr, const V& value) {
  return setter(desc, attr, &value, sizeof(V));
}

}  // namespace baracuda::vendor
