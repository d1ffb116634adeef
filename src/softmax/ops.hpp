// The softmax family's math, shared by the CUDA kernels and the host
// reference. Forward over a row x (z = sign * x):
//   m = max z,  s = sum exp(z - m),  out = f(z, m, s).
// Backward from (grad g, forward output y): one row sum t = sum term(g, y),
// then grad_input = grad(g, y, t).
// gumbel_softmax and sparsemax have kernels of their own (sparse.cuh); the
// backward of gumbel_softmax is softmax's scaled by 1 / tau.
#pragma once

#include <cmath>

#include "core/dtype_traits.hpp"
#include "core/philox.hpp"

namespace baracuda::smax {

template <int Kind>  // 0 softmax, 1 log_softmax, 2 softmin
struct Softmax {
  static constexpr const char* name = Kind == 0 ? "softmax" : Kind == 1 ? "log_softmax" : "softmin";
  static constexpr const char* doc = Kind == 0 ? "exp(x) / sum(exp(x)) along dim"
                                     : Kind == 1 ? "x - log(sum(exp(x))) along dim"
                                                 : "softmax(-x) along dim";
  static constexpr bool kLog = Kind == 1;
  static constexpr bool kBackwardKernel = true;
  template <class M> static BCD_HD M sign() { return Kind == 2 ? M(-1) : M(1); }
  template <class M> static BCD_HD M out(M z, M max, M sum) {
    if constexpr (kLog) return z - max - log(sum);
    else return exp(z - max) / sum;
  }
  /// Backward row sum: sum(g * y), or sum(g) for log_softmax.
  template <class M> static BCD_HD M term(M g, M y) {
    if constexpr (kLog) return g;
    else return g * y;
  }
  template <class M> static BCD_HD M grad(M g, M y, M t) {
    if constexpr (kLog) return g - exp(y) * t;
    else return sign<M>() * y * (g - t);
  }
};

/// Attributes of one run: the backward gradient is scaled by grad_scale
/// (1 / tau for gumbel_softmax, 1 otherwise).
struct RowParams {
  double tau = 1, grad_scale = 1;
  bool hard = false;
  uint64_t seed = 0, offset = 0;
};

/// Note [Gumbel noise]: the columns 4q .. 4q + 3 of row `row` of a
/// gumbel_softmax draw the four words w of Philox-4x32-10 with key `seed`
/// at counter (q, q >> 32, r, r >> 32), r = offset + row (mod 2^64): column
/// c takes word c % 4, u = uniform_open01(w[c % 4]) and g = -log(-log(u)).
/// `row` is the logical row (row-major over every dim but `dim`), `col` the
/// index along `dim`: the sample depends on neither the strides nor the
/// backend. Advance offset by the number of rows between calls for fresh noise.
struct GumbelSoftmax {
  static constexpr const char* name = "gumbel_softmax";
  static constexpr bool kBackwardKernel = false;  // softmax_backward's, scaled
  static constexpr int kGroup = 4;  ///< columns per Philox call
  /// g[e]: the noise of column kGroup * q + e.
  template <class M>
  static BCD_HD void noise(const RowParams& p, int64_t row, int64_t q, M (&g)[kGroup]) {
    const uint64_t r = p.offset + uint64_t(row), c = uint64_t(q);
    const PhiloxWords w = philox(p.seed, uint32_t(c), uint32_t(c >> 32), uint32_t(r), uint32_t(r >> 32));
    for (int e = 0; e < kGroup; ++e) g[e] = -log(-log(uniform_open01<M>(w.v[e])));
  }
};

/// sparsemax(z) = max(z - tau, 0) with sum = 1; backward on the support s
/// (out > 0): grad_input = g - sum_s(g) / |s| there, 0 elsewhere.
struct Sparsemax {
  static constexpr const char* name = "sparsemax";
  static constexpr bool kBackwardKernel = true;
};

template <class... Ops>
struct OpList {};
using SoftmaxOps = OpList<Softmax<0>, Softmax<1>, Softmax<2>>;
using SparseOps = OpList<GumbelSoftmax, Sparsemax>;

/// Storage types: the four floats and both fp8 formats.
using SoftmaxTypes = Concat<FloatTypes, Fp8Types>::type;

}  // namespace baracuda::smax
