// CUDA row losses (cosine_embedding, triplet_margin, multi_margin,
// multilabel_margin) for dtypes: float, double.
#include "loss/kernels_row.cuh"
#include "loss/register.hpp"

namespace baracuda::loss {
namespace {
template <class L, class T, class Index>
struct CudaRowLoss {
  static Status run(const RowLossLaunch& rl, const RowParams& p, CUstream_st* s) { return row_loss_on_cuda<L, T, Index>(rl, p, s); }
};
[[maybe_unused]] const bool registered = register_row_losses<CudaRowLoss, TypeList<float, double>>(cuda_row_losses());
}  // namespace
}  // namespace baracuda::loss
