// The host reference of batch_norm and batch_norm_backward: each channel in
// f64, two passes for the statistics (mean, then squared deviations), sums in
// space order. The test oracle (Note [Batch norm statistics]).
#include <cmath>
#include <limits>

#include "core/dtype_traits.hpp"
#include "norm/batch_norm.hpp"

namespace baracuda::norm::bn {

BatchNormTable& host_batch_norm() {
  static BatchNormTable table;
  return table;
}

namespace {

template <class U>
U& at(const ChannelVec& v, int64_t c) {
  return reinterpret_cast<U*>(v.data)[c * v.stride];
}

/// f(offsets of x, y, g) for every space element of channel c, in space order.
template <class F>
void walk_channel(const BatchNormLaunch& l, int64_t c, F&& f) {
  for (int64_t r = 0; r < l.rows; ++r) {
    int64_t off[kFull];
    l.row_offsets.get(r, off);
    for (int k = 0; k < kFull; ++k) off[k] += c * l.channel_stride[k];
    for (int64_t i = 0; i < l.row_len; ++i) {
      int64_t o[kFull];
      for (int k = 0; k < kFull; ++k) o[k] = off[k] + i * l.row_stride[k];
      f(o);
    }
  }
}

template <class T, class P, bool kBackward>
struct HostBatchNorm {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;

  static Status run(const BatchNormLaunch& l, CUstream_st*) {
    auto x = [&](const int64_t* o) { return convert<double>(reinterpret_cast<const T*>(l.data[kX])[o[kX]]); };
    auto param = [&](const ChannelVec& v, int64_t c, double absent) {
      return v.data ? convert<double>(at<P>(v, c)) : absent;
    };
    const double n = double(l.count);
    for (int64_t c = 0; c < l.channels; ++c) {
      if constexpr (!kBackward) {
        double mean, invstd, var = 0;
        if (l.training) {
          // Sums relative to the channel's first element: a constant channel
          // (a broadcast input) has exactly zero deviation, as on the GPU.
          double sum = 0, sq = 0, shift = 0;
          bool first = true;
          walk_channel(l, c, [&](const int64_t* o) {
            if (first) shift = x(o), first = false;
            sum += x(o) - shift;
          });
          mean = l.count ? shift + sum / n : std::numeric_limits<double>::quiet_NaN();
          walk_channel(l, c, [&](const int64_t* o) { sq += (x(o) - mean) * (x(o) - mean); });
          var = l.count ? sq / n : std::numeric_limits<double>::quiet_NaN();
          invstd = invstd_of(var, l.eps);
        } else {
          mean = param(l.running_mean, c, 0);
          invstd = invstd_of(param(l.running_var, c, 1), l.eps);
        }
        if (l.running_mean.data) {
          double rm = param(l.running_mean, c, 0), rv = param(l.running_var, c, 1);
          if (l.training && l.count > 0) {
            rm = running_update(rm, mean, l.momentum);
            rv = running_update(rv, var * n / (n - 1), l.momentum);
          }
          at<P>(l.running_mean_out, c) = convert<P>(rm);
          at<P>(l.running_var_out, c) = convert<P>(rv);
        }
        at<S>(l.save_mean, c) = convert<S>(mean);
        at<S>(l.save_invstd, c) = convert<S>(invstd);
        const double scale = invstd * param(l.weight, c, 1), bias = param(l.bias, c, 0);
        walk_channel(l, c, [&](const int64_t* o) {
          reinterpret_cast<T*>(l.data[kY])[o[kY]] = convert<T>((x(o) - mean) * scale + bias);
        });
      } else {
        const bool saved = l.training;
        const double mean = saved ? convert<double>(at<S>(l.save_mean, c)) : param(l.running_mean, c, 0);
        const double invstd = saved ? convert<double>(at<S>(l.save_invstd, c)) : invstd_of(param(l.running_var, c, 1), l.eps);
        auto g = [&](const int64_t* o) { return convert<double>(reinterpret_cast<const T*>(l.data[kG])[o[kG]]); };
        double sum_g = 0, sum_gxm = 0;
        walk_channel(l, c, [&](const int64_t* o) {
          sum_g += g(o);
          sum_gxm += g(o) * (x(o) - mean);
        });
        at<P>(l.grad_weight, c) = convert<P>(sum_gxm * invstd);
        at<P>(l.grad_bias, c) = convert<P>(sum_g);
        const auto k = grad_coefficients<double>(l.training, param(l.weight, c, 1), mean, invstd, sum_g, sum_gxm, l.count);
        walk_channel(l, c, [&](const int64_t* o) {
          reinterpret_cast<T*>(l.data[kY])[o[kY]] = convert<T>(k.k_g * (g(o) - k.mean_g) - k.k_x * (x(o) - k.mean));
        });
      }
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_batch_norm<HostBatchNorm>(host_batch_norm(), BatchNormPairs{});

}  // namespace
}  // namespace baracuda::norm::bn
