// The host reference of the loss family: pointwise losses through the
// elementwise host launcher, class and row losses row by row in f64.
// Out-of-range targets are an error here (the CUDA kernels write NaN for
// their rows).
#include <cmath>
#include <vector>

#include "core/errors.hpp"
#include "elementwise/host_launcher.hpp"
#include "loss/register.hpp"

namespace baracuda::loss {

PointwiseTable& host_pointwise() {
  static PointwiseTable table;
  return table;
}
ClassTable& host_class_losses() {
  static ClassTable table;
  return table;
}
RowTable& host_row_losses() {
  static RowTable table;
  return table;
}

namespace {

template <class L, class T, class Index>
Status class_loss_on_host(const ClassLaunch& cl, const ClassParams& p, CUstream_st*) {
  using M = double;
  using Saved = math_t<T, false>;  // the lse operand: f32, f64 for f64
  constexpr bool kProbs = is_float_v<Index>;
  const rows::RowLaunch& l = cl.rows;
  const rows::OffsetCalc<kSlots, int64_t> outer(l.outer);
  const int64_t C = l.cols, n = l.rows;
  auto stride = [&](int k) { return l.inner.stride[k][0]; };
  auto weight = [&](int64_t c) -> M {
    return p.weighted ? convert<M>(reinterpret_cast<const T*>(l.data[kWeight])[c * stride(kWeight)]) : M(1);
  };
  M w_total = 0;
  for (int64_t c = 0; c < C; ++c) w_total += weight(c);

  // Targets first: validity and the per-row weights d_r.
  std::vector<int64_t> target(kProbs ? 0 : n);
  std::vector<M> d(n, M(1));
  for (int64_t r = 0; r < n && !kProbs; ++r) {
    int64_t off[kSlots];
    outer.get(r, off);
    target[r] = index_of(reinterpret_cast<const Index*>(l.data[kTarget])[off[kTarget]]);
    if (target[r] == p.ignore_index) {
      d[r] = 0;
    } else if (target[r] < 0 || target[r] >= C) {
      return invalid("'target' holds class index ", target[r], " (row ", r, "), outside [0, ", C,
                     ") and not ignore_index ", p.ignore_index);
    } else {
      d[r] = weight(target[r]);
    }
  }
  M sum_d = 0;
  for (M v : d) sum_d += v;
  const ClassParams ep = effective<kProbs>(p);
  const RowScale<M> reduced = row_scale<M>(ep, C, n, sum_d);
  const RowScale<M> per_row = row_scale<M>(ep, C, n, M(1));
  const M e = kProbs ? p.smoothing : 0;
  std::vector<M> z(C), pt(kProbs ? C : 0);
  M nll_sum = 0, smooth_sum = 0;  // reduced: scaled once at the end, as the CUDA finalize does
  for (int64_t r = 0; r < n; ++r) {
    int64_t off[kSlots];
    outer.get(r, off);
    const T* in = reinterpret_cast<const T*>(l.data[kInput]) + off[kInput];
    for (int64_t c = 0; c < C; ++c) z[c] = convert<M>(in[c * stride(kInput)]);
    if constexpr (kProbs) {
      const T* tp = reinterpret_cast<const T*>(l.data[kTarget]) + off[kTarget];
      for (int64_t c = 0; c < C; ++c) pt[c] = (1 - e) * convert<M>(tp[c * stride(kTarget)]) + e / M(C);
    }
    const bool ignored = !kProbs && target[r] == p.ignore_index;
    const int64_t t = kProbs || ignored ? 0 : target[r];
    M lse = 0;
    if (L::kLogits) {
      if (p.mode == Mode::backward) {
        lse = M(reinterpret_cast<const Saved*>(l.data[kLse])[off[kLse]]);
      } else {
        M m = -INFINITY, s = 0;
        for (M v : z) m = v > m || v != v ? v : m;
        for (M v : z) s += std::exp(v - m);
        lse = m + std::log(s);
      }
    }
    // a = sum w_c p'_c (probabilities)
    M a = 0;
    for (int64_t c = 0; c < C && kProbs; ++c) a += weight(c) * pt[c];
    if (p.mode != Mode::backward) {
      M nll = 0, smooth = 0;
      if constexpr (kProbs) {
        for (int64_t c = 0; c < C; ++c) nll += weight(c) * pt[c] * (lse - z[c]);
      } else if (!ignored) {
        nll = L::kLogits ? d[r] * (lse - z[t]) : -d[r] * z[t];
        if (L::kLogits && p.smoothing != 0)
          for (int64_t c = 0; c < C; ++c) smooth += weight(c) * (lse - z[c]);
      }
      if (L::kLogits && p.mode == Mode::forward) reinterpret_cast<Saved*>(l.data[kLse])[off[kLse]] = Saved(lse);
      if (p.reduction == Reduction::none)
        reinterpret_cast<T*>(l.data[kOut])[off[kOut]] = convert<T>(per_row.nll * nll + per_row.smooth * smooth);
      else
        nll_sum += nll, smooth_sum += smooth;
    }
    if (p.mode == Mode::forward) continue;
    RowScale<M> sc = p.reduction == Reduction::mean ? reduced : per_row;
    const M go = p.mode == Mode::fused ? (cl.grad_scale ? M(*static_cast<const Saved*>(cl.grad_scale)) : M(1)) : convert<M>(reinterpret_cast<const T*>(l.data[kGradOutput])[off[kGradOutput]]);
    T* grad = reinterpret_cast<T*>(l.data[kGradInput]) + off[kGradInput];
    for (int64_t c = 0; c < C; ++c) {
      M g = 0;
      if constexpr (!L::kLogits) {
        g = !ignored && c == t ? -go * sc.nll * d[r] : M(0);
      } else {
        const M pc = std::exp(z[c] - lse);
        if constexpr (kProbs) {
          g = go * sc.nll * (pc * a - weight(c) * pt[c]);
        } else if (!ignored) {
          g = go * (sc.nll * d[r] * (pc - (c == t ? M(1) : M(0))) + sc.smooth * (w_total * pc - weight(c)));
        }
      }
      grad[c * stride(kGradInput)] = convert<T>(g);
    }
  }
  // A mean over no rows (or none kept) is inf * 0: nan, as torch's 0 / 0.
  if (p.mode != Mode::backward && p.reduction != Reduction::none)
    *static_cast<T*>(cl.scalar_out) = convert<T>(reduced.nll * nll_sum + reduced.smooth * smooth_sum);
  return Status::ok();
}

template <class L, class T, class Index>
struct HostClassLoss {
  static Status run(const ClassLaunch& cl, const ClassParams& p, CUstream_st* s) {
    return class_loss_on_host<L, T, Index>(cl, p, s);
  }
};

/// One thread owns every column of a row (row_losses.hpp).
struct HostRow {
  int64_t cols;
  template <class F> void each(F&& f) const {
    for (int64_t c = 0; c < cols; ++c) f(c);
  }
  template <class U, class F> void each_of(const U* p, int64_t stride, F&& f) const {
    for (int64_t c = 0; c < cols; ++c) f(c, p[c * stride]);
  }
  template <class U, class F> void each_of_wide(const U* p, int64_t stride, F&& f) const { each_of(p, stride, f); }
  template <class U, class F> void map_of(const U* p, int64_t stride, U* q, int64_t qstride, F&& f) const {
    for (int64_t c = 0; c < cols; ++c) q[c * qstride] = f(c, p[c * stride]);
  }
  double sum(double v) const { return v; }
  double max(double v) const { return v; }
  void sync() const {}
  bool leader() const { return true; }
};

template <class L, class T, class Index>
struct HostRowLoss {
  static Status run(const RowLossLaunch& rl, const RowParams& p, CUstream_st*) {
    const rows::RowLaunch& l = rl.rows;
    const rows::OffsetCalc<rows::kMaxOperands, int64_t> outer(l.outer);
    const HostRow ctx{l.cols};
    std::vector<uint8_t> mask(l.cols);
    constexpr TargetKind kind = L::meta.target;
    for (int64_t row = 0; row < l.rows; ++row) {  // targets first: an error, not NaN
      int64_t off[rows::kMaxOperands];
      outer.get(row, off);
      RowOperands<T, Index> r = bind_row<L, T, Index>(l, off, p);
      const int64_t n = kind == TargetKind::index_list ? l.cols : kind == TargetKind::index_per_row ? 1 : 0;
      for (int64_t c = 0; c < n; ++c)
        if (r.index(c) < kTargetMin<L> || r.index(c) >= l.cols)
          return invalid("'target' holds class index ", r.index(c), " (row ", row, "), outside [",
                         kTargetMin<L>, ", ", l.cols, ")");
    }
    const int out = p.backward ? 0 : L::meta.inputs;
    double total = 0;
    for (int64_t row = 0; row < l.rows; ++row) {
      int64_t off[rows::kMaxOperands];
      outer.get(row, off);
      RowOperands<T, Index> r = bind_row<L, T, Index>(l, off, p);
      r.mask = mask.data();
      const T* go = p.reduction == 0 ? reinterpret_cast<const T*>(l.data[out]) + off[out] : static_cast<const T*>(rl.scalar_grad);
      const double scale = p.reduction == 1 ? 1.0 / double(l.rows) : 1.0;
      const double loss = row_loss<L, double>(ctx, r, p, p.backward ? convert<double>(*go) * scale : 0.0);
      if (p.backward) continue;
      if (p.reduction == 0) reinterpret_cast<T*>(l.data[out])[off[out]] = convert<T>(loss);
      else total += loss;
    }
    if (!p.backward && p.reduction != 0)
      *static_cast<T*>(rl.scalar_out) = convert<T>(p.reduction == 1 ? total / double(l.rows) : total);
    return Status::ok();
  }
};

[[maybe_unused]] const bool pointwise_registered =
    register_pointwise<ew::HostLauncher, true, LossTypes>(host_pointwise());
[[maybe_unused]] const bool class_registered = register_class_losses<HostClassLoss, LossTypes>(host_class_losses());
[[maybe_unused]] const bool row_registered = register_row_losses<HostRowLoss, LossTypes>(host_row_losses());

}  // namespace
}  // namespace baracuda::loss
