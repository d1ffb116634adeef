// The host reference GEMM: every element's products summed in a fixed order,
// in f64 for floats and i64 for integers.
#include "gemm/epilogue.hpp"
#include "gemm/register.hpp"

namespace baracuda::gemm {

namespace {

template <class TA, class TB, class Out>
struct HostGemm {
  static Status run(const Problem& p, CUstream_st*) {
    using Acc = acc_t<TA, true>;
    using Scale = scale_t<TA>;
    const bool in_k = p.scales_in_k();
    const int64_t batches = p.batch_count(), reds = p.red_count();
    for (int64_t bi = 0; bi < batches; ++bi) {
      const TA* a = reinterpret_cast<const TA*>(p.a.data) + offset_of(bi, p.batch_rank, p.batch_shape, p.a.batch_stride);
      const TB* b = reinterpret_cast<const TB*>(p.b.data) + offset_of(bi, p.batch_rank, p.batch_shape, p.b.batch_stride);
      const Out* c = p.reads_c() ? reinterpret_cast<const Out*>(p.c.data) +
                                       offset_of(bi, p.batch_rank, p.batch_shape, p.c.batch_stride)
                                 : nullptr;
      Out* d = reinterpret_cast<Out*>(p.d.data) + offset_of(bi, p.batch_rank, p.batch_shape, p.d.batch_stride);
      for (int64_t m = 0; m < p.m; ++m) {
        for (int64_t n = 0; n < p.n; ++n) {
          Acc acc = 0;
          for (int64_t r = 0; r < reds; ++r) {
            const TA* ar = a + offset_of(r, p.red_rank, p.red_shape, p.a.red_stride) + m * p.a.row_stride;
            const TB* br = b + offset_of(r, p.red_rank, p.red_shape, p.b.red_stride) + n * p.b.col_stride;
            for (int64_t k = 0; k < p.k; ++k) {
              Acc x = convert<Acc>(ar[k * p.a.col_stride]), y = convert<Acc>(br[k * p.b.row_stride]);
              if (in_k) {
                x *= scale_at<Acc, Scale>(p.scale_a, m, k / kScaleBlock);
                y *= scale_at<Acc, Scale>(p.scale_b, n, k / kScaleBlock);
              }
              acc += x * y;
            }
          }
          d[m * p.d.row_stride + n * p.d.col_stride] = finish<Out, Acc, Scale>(
              p, sum_scale<Acc, Scale>(p, m, n), acc, c ? c + m * p.c.row_stride + n * p.c.col_stride : nullptr, n);
        }
      }
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_gemms<HostGemm>(host_gemms()) && register_scaled_gemms<HostGemm>(host_gemms());

}  // namespace
}  // namespace baracuda::gemm
