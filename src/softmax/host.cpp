// Host references (f64 math) of gumbel_softmax and sparsemax. sparsemax
// finds its threshold by sorting the row (the CUDA kernels iterate
// instead: Note [Sparsemax threshold] in sparse.cuh), so the two check each
// other.
#include <algorithm>
#include <functional>
#include <vector>

#include "softmax/register.hpp"

namespace baracuda::smax {
namespace {

template <class Op, class T, bool kBackward>
Status sparse_on_host(const RowLaunch& l, const RowParams& p, CUstream_st*) {
  using M = math_t<T, true>;
  const rows::OffsetCalc<3, int64_t> outer(l.outer);
  const auto& st = l.inner.stride;
  std::vector<M> z(l.cols), sorted;
  for (int64_t r = 0; r < l.rows; ++r) {
    int64_t off[3];
    outer.get(r, off);
    auto at = [&](int k, int64_t c) -> T& { return reinterpret_cast<T*>(l.data[k])[off[k] + c * st[k][0]]; };
    if constexpr (std::is_same_v<Op, GumbelSoftmax>) {  // out, soft, logits
      M max = -INFINITY, sum = 0;
      int64_t arg = 0;
      M g[GumbelSoftmax::kGroup];
      for (int64_t c = 0; c < l.cols; ++c) {
        if (c % GumbelSoftmax::kGroup == 0) GumbelSoftmax::noise(p, r, c / GumbelSoftmax::kGroup, g);
        z[c] = (convert<M>(at(2, c)) + g[c % GumbelSoftmax::kGroup]) / p.tau;
        if (z[c] > max || (z[c] != z[c] && max == max)) max = z[c], arg = c;
      }
      for (int64_t c = 0; c < l.cols; ++c) sum += std::exp(z[c] - max);
      for (int64_t c = 0; c < l.cols; ++c) {
        const M y = std::exp(z[c] - max) / sum;
        at(1, c) = convert<T>(y);
        at(0, c) = convert<T>(p.hard ? M(c == arg) : y);
      }
    } else if constexpr (!kBackward) {  // out, input
      for (int64_t c = 0; c < l.cols; ++c) z[c] = convert<M>(at(1, c));
      sorted = z;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      // The support is the k largest for the largest k with 1 + k z_(k) > z_(1) + ... + z_(k).
      M prefix = sorted[0], support_sum = sorted[0];
      int64_t k = 1;
      for (int64_t j = 2; j <= l.cols; ++j) {
        prefix += sorted[j - 1];
        if (1 + M(j) * sorted[j - 1] > prefix) k = j, support_sum = prefix;
      }
      const bool nan = std::any_of(z.begin(), z.end(), [](M v) { return v != v; });
      const M tau = nan ? M(NAN) : (support_sum - 1) / M(k);
      for (int64_t c = 0; c < l.cols; ++c) {
        const M d = z[c] - tau;
        at(0, c) = convert<T>(d > 0 || d != d ? d : M(0));
      }
    } else {  // grad_input, grad_output, output
      M sum = 0;
      int64_t n = 0;
      for (int64_t c = 0; c < l.cols; ++c)
        if (convert<M>(at(2, c)) > 0) sum += convert<M>(at(1, c)), ++n;
      for (int64_t c = 0; c < l.cols; ++c)
        at(0, c) = convert<T>(convert<M>(at(2, c)) > 0 ? convert<M>(at(1, c)) - sum / M(n) : M(0));
    }
  }
  return Status::ok();
}

template <class Op, class T, bool kBackward>
struct HostSparse {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) { return sparse_on_host<Op, T, kBackward>(l, p, s); }
};
[[maybe_unused]] const bool registered = register_softmax<HostSparse, SoftmaxTypes, SparseOps>(host_softmax());

}  // namespace
}  // namespace baracuda::smax
