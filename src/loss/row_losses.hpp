// Row losses: one loss per row of D (or C) values along the last dim, whose
// gradient needs sums over the row (cosine_embedding, triplet_margin,
// multi_margin, multilabel_margin). A loss body sees its row through
// RowOperands and a `ctx` that owns the threads of the row:
//   ctx.each(f)  calls f(c) for the columns this thread owns,
//   ctx.each_of(p, stride, f) calls f(c, p[c * stride]) for the columns this
//                thread owns in a read of one operand (CUDA: whole 16-byte
//                vectors where the row allows, two in flight; the columns may
//                differ from each()'s, so a body writes only what it reads),
//   ctx.each_of_wide(p, stride, f) as each_of, more reads in flight (CUDA:
//                up to four vectors; for bodies whose f holds few registers),
//   ctx.map_of(p, stride, q, qstride, f) stores q[c] = f(c, p[c * stride])
//                for the columns this thread owns (CUDA: whole vectors in and
//                out where both rows allow; q may be p),
//   ctx.sum(v)   the sum over the row (every thread of the row gets it),
//   ctx.sync()   orders the row's writes to its scratch before later reads,
//   ctx.leader() one thread of the row.
// The host reference runs the same bodies with one thread per row in f64,
// the CUDA kernel with TPR threads per row (kernels_row.cuh). The plan then
// takes the mean or sum of the per-row losses in a fixed order.
#pragma once

#include <cmath>
#include <cstdint>

#include "baracuda/registry.hpp"
#include "core/dtype_traits.hpp"
#include "core/rows.hpp"
#include "elementwise/functors.hpp"

struct CUstream_st;

namespace baracuda::loss {

/// What the input after the differentiable ones holds.
enum class TargetKind : uint8_t {
  none,
  sign,           ///< per row: 1 or -1 (other values: loss 0), floating or integer
  index_per_row,  ///< per row: a class in [0, C)
  index_list,     ///< full: classes in [0, C), the list ends at the first -1
};

struct RowLossMeta {
  const char* name;
  int inputs;  ///< operands: `grads` full floating ones (differentiable), then target, then weight [C]
  int grads;
  const char* input_names[4];
  Domain domains[4];
  ew::AttrDefault attrs[4];
  TargetKind target;
  int max_rank;  ///< 2: [N, D] or [D], as torch; 0: any rank >= 1 (the rows over the leading dims)
  const char* doc;
};

/// Launch-time values: the loss's attributes in meta order, the reduction
/// (0 none, 1 mean, 2 sum) and whether a class weight is given.
struct RowParams {
  double v[4] = {};
  int reduction = 1;
  bool backward = false;
  bool weighted = false;
  template <class M>
  BCD_HD M get(int i) const {
    return M(v[i]);
  }
};

/// One row of every operand. `mask` is C bytes of scratch (index lists).
template <class T, class Index>
struct RowOperands {
  const T* x[3] = {};
  int64_t sx[3] = {};
  T* g[3] = {};
  int64_t sg[3] = {};
  const Index* target = nullptr;
  int64_t st = 0;
  const T* weight = nullptr;
  int64_t sw = 0;
  uint8_t* mask = nullptr;
  int64_t cols = 0;

  template <class M>
  BCD_HD M at(int k, int64_t c) const {
    return convert<M>(x[k][c * sx[k]]);
  }
  template <class M>
  BCD_HD void set_grad(int k, int64_t c, M v) const {
    g[k][c * sg[k]] = convert<T>(v);
  }
  BCD_HD int64_t index(int64_t c) const { return convert<int64_t>(target[c * st]); }
  template <class M>
  BCD_HD M target_value() const {
    return convert<M>(target[0]);
  }
  template <class M>
  BCD_HD M weight_at(int64_t c) const {
    return weight ? convert<M>(weight[c * sw]) : M(1);
  }
};

template <class M>
BCD_HD M relu_(M v) {
  return v > M(0) ? v : M(0);
}

/// 1 - cos where target = 1, max(0, cos - margin) where -1;
/// cos = x1.x2 / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)), as torch.
struct CosineEmbeddingLoss {
  static constexpr RowLossMeta meta{"cosine_embedding_loss", 3, 2, {"input1", "input2", "target"},
                                    {{-2, 2}, {-2, 2}, {1, 1, true}}, {{"margin", 0}}, TargetKind::sign, 2,
                                    "1 - cos(input1, input2) where target = 1, max(0, cos - margin) where -1; "
                                    "rows along the last dim"};
  template <class M>
  struct Cos {
    M cos, denom, m1, m2, y;
  };
  template <class M, class Ctx, class R>
  static BCD_HD Cos<M> cosine(const Ctx& ctx, const R& r) {
    const M y = r.template target_value<M>();  // read before the sums: `out` may alias the target
    M dot = 0, s1 = 0, s2 = 0;
    ctx.each([&](int64_t c) {
      const M a = r.template at<M>(0, c), b = r.template at<M>(1, c);
      dot += a * b, s1 += a * a, s2 += b * b;
    });
    const M m1 = ctx.sum(s1) + M(1e-12), m2 = ctx.sum(s2) + M(1e-12), denom = sqrt(m1 * m2);
    return {ctx.sum(dot) / denom, denom, m1, m2, y};
  }
  template <class M, class Ctx, class R>
  static BCD_HD M forward(const Ctx& ctx, const R& r, const RowParams& p) {
    const Cos<M> k = cosine<M>(ctx, r);
    return k.y == M(1) ? M(1) - k.cos : k.y == M(-1) ? relu_(k.cos - p.get<M>(0)) : M(0);
  }
  template <class M, class Ctx, class R>
  static BCD_HD void backward(const Ctx& ctx, const R& r, const RowParams& p, M go) {
    const Cos<M> k = cosine<M>(ctx, r);
    // d loss / d cos; the clamp passes the gradient at cos = margin, as torch's clamp_min.
    const M s = k.y == M(1) ? -go : k.y == M(-1) && k.cos - p.get<M>(0) >= M(0) ? go : M(0);
    ctx.each([&](int64_t c) {
      const M a = r.template at<M>(0, c), b = r.template at<M>(1, c);
      r.set_grad(0, c, s * (b / k.denom - k.cos * a / k.m1));
      r.set_grad(1, c, s * (a / k.denom - k.cos * b / k.m2));
    });
  }
};

/// max(0, margin + d(a, p) - d(a, n)), d(x, y) = |x - y + eps|_p (pairwise_distance);
/// swap: d(a, n) becomes min(d(a, n), d(p, n)).
struct TripletMarginLoss {
  static constexpr RowLossMeta meta{"triplet_margin_loss", 3, 3, {"anchor", "positive", "negative"},
                                    {{-2, 2}, {-2, 2}, {-2, 2}}, {{"margin", 1}, {"p", 2}, {"eps", 1e-6}, {"swap", 0}},
                                    TargetKind::none, 0,
                                    "max(0, margin + |a - p + eps|_p - |a - n + eps|_p) per row (last dim); swap "
                                    "takes the smaller of |a - n|, |p - n|"};
  template <class M>
  static BCD_HD M term(M v, M p) {
    const M a = v < M(0) ? -v : v;
    return p == M(1) ? a : p == M(2) ? a * a : pow(a, p);
  }
  template <class M>
  static BCD_HD M root(M s, M p) {
    return p == M(1) ? s : p == M(2) ? sqrt(s) : pow(s, M(1) / p);
  }
  /// d |v|_p / d v_c (0 where the norm is 0, as torch's norm backward).
  template <class M>
  static BCD_HD M slope(M v, M d, M p) {
    if (d == M(0)) return M(0);
    const M sign = v > M(0) ? M(1) : v < M(0) ? M(-1) : M(0);
    return p == M(1) ? sign : p == M(2) ? v / d : sign * pow(sign * v / d, p - M(1));
  }
  /// root(t) - root(s) for sums t, s >= 0 whose difference `delta` was summed
  /// termwise: no cancellation where t and s are close.
  template <class M>
  static BCD_HD M root_diff(M s, M t, M delta, M p) {
    if (p == M(1)) return delta;
    const M big = s > t ? s : t;
    if (big == M(0)) return M(0);
    if (p == M(2)) return delta / (sqrt(t) + sqrt(s));
    if (M(2) * (delta < M(0) ? -delta : delta) > big) return root(t, p) - root(s, p);  // far apart
    return root(s, p) * expm1(log1p(delta / s) / p);  // s >= big / 2 > 0 here
  }
  template <class M>
  struct Dist {
    M ap, an, pn, active, w_an, w_pn;  ///< distances; the clamp's gate; the weights of an and pn in min(an, pn)
  };
  // d(a, p) - d(a, n) is a small difference of large distances on long rows
  // (rows of 65537 values in [-2, 2]: distances ~1e5 for p = 1, whose f32
  // sums are off by ~1e-2). The sums of the termwise differences
  // (sum |a - p|^p - |a - n|^p, terms of either sign) give it to the
  // accuracy of the terms instead: the loss, and which of d(a, n), d(p, n)
  // is smaller, come from them.
  template <class M, class Ctx, class R>
  static BCD_HD Dist<M> distances(const Ctx& ctx, const R& r, const RowParams& prm) {
    const M p = prm.get<M>(1), eps = prm.get<M>(2);
    const bool swap = prm.v[3] != 0;
    M ap = 0, an = 0, pn = 0, dan = 0, dpn = 0;
    ctx.each([&](int64_t c) {
      const M a = r.template at<M>(0, c), q = r.template at<M>(1, c), n = r.template at<M>(2, c);
      const M t_ap = term(a - q + eps, p), t_an = term(a - n + eps, p);
      ap += t_ap, an += t_an, dan += t_ap - t_an;
      if (swap) {
        const M t_pn = term(q - n + eps, p);
        pn += t_pn, dpn += t_ap - t_pn;
      }
    });
    Dist<M> d;
    const M s_ap = ctx.sum(ap), s_an = ctx.sum(an), d_an = ctx.sum(dan);
    d.ap = root(s_ap, p), d.an = root(s_an, p);
    M gap = root_diff(s_an, s_ap, d_an, p);  // d(a, p) - d(a, n)
    d.w_an = M(1), d.w_pn = M(0);
    if (swap) {
      const M s_pn = ctx.sum(pn), d_pn = ctx.sum(dpn);  // d_pn > d_an: d(p, n) < d(a, n)
      d.pn = root(s_pn, p);
      // torch's minimum splits the gradient at a tie.
      d.w_an = d_an > d_pn ? M(1) : d_an == d_pn ? M(0.5) : M(0);
      d.w_pn = M(1) - d.w_an;
      if (d_pn > d_an) gap = root_diff(s_pn, s_ap, d_pn, p);
    } else {
      d.pn = M(0);
    }
    d.active = prm.get<M>(0) + gap;
    return d;
  }
  template <class M, class Ctx, class R>
  static BCD_HD M forward(const Ctx& ctx, const R& r, const RowParams& p) {
    return relu_(distances<M>(ctx, r, p).active);
  }
  template <class M, class Ctx, class R>
  static BCD_HD void backward(const Ctx& ctx, const R& r, const RowParams& prm, M go) {
    const Dist<M> d = distances<M>(ctx, r, prm);
    const M p = prm.get<M>(1), eps = prm.get<M>(2);
    const M s = d.active >= M(0) ? go : M(0);  // clamp_min passes the gradient at 0
    ctx.each([&](int64_t c) {
      const M a = r.template at<M>(0, c), q = r.template at<M>(1, c), n = r.template at<M>(2, c);
      const M gap = slope(a - q + eps, d.ap, p), gan = d.w_an * slope(a - n + eps, d.an, p);
      const M gpn = d.w_pn != M(0) ? d.w_pn * slope(q - n + eps, d.pn, p) : M(0);
      r.set_grad(0, c, s * (gap - gan));
      r.set_grad(1, c, s * (-gap - gpn));
      r.set_grad(2, c, s * (gan + gpn));
    });
  }
};

/// weight[y] / C sum_{c != y} max(0, margin - x_y + x_c)^p, p in {1, 2}.
struct MultiMarginLoss {
  static constexpr RowLossMeta meta{"multi_margin_loss", 3, 1, {"input", "target", "weight"},
                                    {{-2, 2}, {0, 1, false, false, true}, {0.5, 2}}, {{"p", 1}, {"margin", 1}},
                                    TargetKind::index_per_row, 2,
                                    "weight[y] / C sum over c != y of max(0, margin - x[y] + x[c])^p (p 1 or 2); "
                                    "weight [C] or [0] (none)"};
  // The row is read in whole vectors, f32 four in flight (each_of_wide):
  // the target and x[t] are two dependent loads before it, the only serial
  // steps of a row (the CUDA kernel asks L2 for the row first).
  template <class M, class Ctx, class R>
  static BCD_HD M forward(const Ctx& ctx, const R& r, const RowParams& p) {
    const int64_t t = r.index(0);
    const M xt = r.template at<M>(0, t), margin = p.get<M>(1);
    const bool square = p.v[0] == 2;
    M s = 0;
    ctx.each_of_wide(r.x[0], r.sx[0], [&](int64_t c, auto x) {
      const M z = margin - xt + convert<M>(x);
      if (c != t && z > M(0)) s += square ? z * z : z;
    });
    return r.template weight_at<M>(t) * ctx.sum(s) / M(r.cols);
  }
  template <class M, class Ctx, class R>
  static BCD_HD void backward(const Ctx& ctx, const R& r, const RowParams& p, M go) {
    const int64_t t = r.index(0);
    const M xt = r.template at<M>(0, t), margin = p.get<M>(1);
    const M scale = go * r.template weight_at<M>(t) / M(r.cols);
    const bool square = p.v[0] == 2;
    M total = 0;
    // Whole vectors in and out (map_of): scalar stores at a vector's lane
    // stride cost 8 (bf16) partial-sector writes per sector (fwd+bwd bf16
    // 1.04x -> 0.73x torch). Column t gets x[t] back for now (the leader
    // writes it after the sum), so x[t] stays intact for every thread when
    // the gradient overwrites the input.
    ctx.map_of(r.x[0], r.sx[0], r.g[0], r.sg[0], [&](int64_t c, auto x) {
      if (c == t) return x;
      const M z = margin - xt + convert<M>(x);
      const M g = z > M(0) ? scale * (square ? M(2) * z : M(1)) : M(0);
      total += g;
      return convert<decltype(x)>(g);
    });
    total = ctx.sum(total);
    if (ctx.leader()) r.set_grad(0, t, -total);
  }
};

/// 1 / C sum over listed targets j and non-targets c of max(0, 1 - x_j + x_c);
/// the target row lists classes and ends at the first -1 (torch's CPU rule:
/// entries after it are not targets). Duplicated targets count twice.
//
// Note [Multilabel lists in registers]
// A row's first kCached listed classes and their values sit in registers.
// Lists of at most kCached classes (the usual case) test "is c listed" against
// them: no per-row mask, so a row costs one read of its targets (which also
// validates them and finds the list's end) and one of its input, and the
// backward finds every listed class's pair count in one pass (kCached sums)
// and writes the gradient row in whole vectors. Longer lists mark the listed
// classes in r.mask (C bytes of workspace) and loop over the list.
struct MultilabelMarginLoss {
  static constexpr RowLossMeta meta{"multilabel_margin_loss", 2, 1, {"input", "target"},
                                    {{-2, 2}, {-1, 1, false, false, true}}, {}, TargetKind::index_list, 2,
                                    "1 / C sum over listed targets j and other classes c of max(0, 1 - x[j] + x[c]); "
                                    "target [N, C] lists classes, padded with -1"};
  /// The list length (the first -1, or C), or -1 when a class is outside [-1, C).
  template <class M, class Ctx, class R>
  static BCD_HD int64_t list_length(const Ctx& ctx, const R& r) {
    M first = M(r.cols);  // as M: exact up to 2^24 columns in f32
    bool bad = false;
    ctx.each_of(r.target, r.st, [&](int64_t c, auto t) {
      const int64_t i = convert<int64_t>(t);
      if (i < -1 || i >= r.cols) bad = true;
      else if (i < 0 && M(c) < first) first = M(c);
    });
    return int64_t(-ctx.max(bad ? M(1) : -first));  // a bad class anywhere: max 1, length -1
  }
  /// Marks the listed classes in r.mask (lists longer than kCached).
  template <class Ctx, class R>
  static BCD_HD void mark(const Ctx& ctx, const R& r, int64_t k) {
    ctx.each([&](int64_t c) { r.mask[c] = 0; });
    ctx.sync();  // every row's mask cleared before it is marked
    ctx.each_of(r.target, r.st, [&](int64_t c, auto t) {
      if (c < k) r.mask[convert<int64_t>(t)] = 1;
    });
    ctx.sync();
  }
  static constexpr int kCached = 8;
  /// Entries past the list hold class -1 (never a column) and value +inf
  /// (1 - inf + x is never a positive margin), so loops over all kCached need
  /// no test of the length.
  template <class M>
  struct Listed {
    M x[kCached];
    int32_t t[kCached];  ///< the classes (32 bits: registers), when `in_regs`
    int64_t k;
    bool in_regs;  ///< k <= kCached (and C < 2^31): "is c listed" from t, else from r.mask
    template <class R>
    BCD_HD bool has(int64_t c, const R& r) const {
      if (!in_regs) return r.mask[c] != 0;
      bool in = false;
      const int32_t c32 = int32_t(c);  // in_regs: C < 2^31
      for (int j = 0; j < kCached; ++j) in |= t[j] == c32;
      return in;
    }
  };
  template <class R>
  static BCD_HD bool fits_regs(const R& r, int64_t k) {
    return k <= kCached && r.cols <= INT32_MAX;
  }
  /// The first kCached listed classes and their values (independent loads).
  template <class M, class R>
  static BCD_HD Listed<M> listed(const R& r, int64_t k) {
    Listed<M> l;
    l.k = k;
    l.in_regs = fits_regs(r, k);
    for (int j = 0; j < kCached; ++j) {
      const int64_t t = j < k ? r.index(j) : 0;
      l.t[j] = int32_t(j < k ? t : -1);
      l.x[j] = j < k ? r.template at<M>(0, t) : M(INFINITY);
    }
    return l;
  }
  /// f(x_j) for every listed target j, in list order.
  template <class M, class R, class F>
  static BCD_HD void each_listed(const Listed<M>& l, const R& r, F&& f) {
    for (int j = 0; j < kCached; ++j) f(l.x[j]);  // +inf past the list: no term
    for (int64_t j = kCached; j < l.k; ++j) f(r.template at<M>(0, r.index(j)));
  }
  template <class M, class Ctx, class R>
  static BCD_HD M forward(const Ctx& ctx, const R& r, const RowParams&, int64_t k) {
    const Listed<M> l = listed<M>(r, k);
    M s = 0;
    if (l.in_regs) {  // two loops: the short-list one holds no mask or list-tail state
      ctx.each_of(r.x[0], r.sx[0], [&](int64_t c, auto v) {
        if (l.has(c, r)) return;
        const M x = convert<M>(v);
        for (int j = 0; j < kCached; ++j) s += relu_(M(1) - l.x[j] + x);  // +inf past the list: no term
      });
    } else {
      mark(ctx, r, k);
      ctx.each_of(r.x[0], r.sx[0], [&](int64_t c, auto v) {
        if (r.mask[c]) return;
        const M x = convert<M>(v);
        each_listed(l, r, [&](M xt) { s += relu_(M(1) - xt + x); });
      });
    }
    return ctx.sum(s) / M(r.cols);
  }
  template <class M, class Ctx, class R>
  static BCD_HD void backward(const Ctx& ctx, const R& r, const RowParams&, M go, int64_t k) {
    const M scale = go / M(r.cols);
    const Listed<M> l = listed<M>(r, k);
    // Written only after every read of the input (in place is not supported: the plan says so).
    if (l.in_regs) {
      // Listed class j: -scale (times its count in the list) per active pair.
      M pairs[kCached] = {};
      ctx.each_of(r.x[0], r.sx[0], [&](int64_t c, auto v) {
        if (l.has(c, r)) return;
        const M x = convert<M>(v);
        for (int j = 0; j < kCached; ++j) pairs[j] += M(1) - l.x[j] + x > M(0) ? M(1) : M(0);
      });
      M grad[kCached];
      for (int j = 0; j < kCached; ++j) {  // k is the same for every thread of the row
        M times = 0;
        for (int i = 0; i < kCached; ++i) times += l.t[i] == l.t[j] ? M(1) : M(0);
        grad[j] = j < k ? -scale * times * ctx.sum(pairs[j]) : M(0);
      }
      ctx.map_of(r.x[0], r.sx[0], r.g[0], r.sg[0], [&](int64_t c, auto v) {
        const M x = convert<M>(v);
        M n = 0, listed_grad = 0;
        bool in = false;
        for (int j = 0; j < kCached; ++j) {
          if (l.t[j] == c) in = true, listed_grad = grad[j];
          n += M(1) - l.x[j] + x > M(0) ? M(1) : M(0);
        }
        return convert<decltype(v)>(in ? listed_grad : scale * n);
      });
      return;
    }
    mark(ctx, r, k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = r.index(j);
      const M xt = r.template at<M>(0, t);
      M pairs = 0, times = 0;
      ctx.each_of(r.x[0], r.sx[0], [&](int64_t c, auto x) {
        if (!r.mask[c] && M(1) - xt + convert<M>(x) > M(0)) pairs += M(1);
      });
      ctx.each_of(r.target, r.st, [&](int64_t c, auto i) {
        if (c < k && convert<int64_t>(i) == t) times += M(1);
      });
      pairs = ctx.sum(pairs), times = ctx.sum(times);
      if (ctx.leader()) r.set_grad(0, t, -scale * times * pairs);
    }
    ctx.each_of(r.x[0], r.sx[0], [&](int64_t c, auto v) {
      if (r.mask[c]) return;
      const M x = convert<M>(v);
      M pairs = 0;
      each_listed(l, r, [&](M xt) { pairs += M(1) - xt + x > M(0) ? M(1) : M(0); });
      r.set_grad(0, c, scale * pairs);
    });
  }
};

template <class... Ls>
struct RowLossList {};
using RowLosses = RowLossList<CosineEmbeddingLoss, TripletMarginLoss, MultiMarginLoss, MultilabelMarginLoss>;

/// Lowest valid class index of a loss's targets.
template <class L>
inline constexpr int64_t kTargetMin = L::meta.target == TargetKind::index_list ? -1 : 0;

/// One row: its loss (forward) or its gradients times `go` (backward). A row
/// with a class index outside [kTargetMin, C) gets NaN (the host reference
/// reports it as an error before it runs).
template <class L, class M, class Ctx, class R>
BCD_HD M row_loss(const Ctx& ctx, const R& r, const RowParams& p, M go) {
  constexpr TargetKind kind = L::meta.target;
  auto bad_row = [&] {
    if (p.backward) ctx.each([&](int64_t c) { r.set_grad(0, c, M(NAN)); });
    return M(NAN);
  };
  if constexpr (kind == TargetKind::index_list) {  // the list's length and the check in one read
    const int64_t k = L::template list_length<M>(ctx, r);
    if (k < 0) return bad_row();
    if (!p.backward) return L::template forward<M>(ctx, r, p, k);
    L::template backward<M>(ctx, r, p, go, k);
    return M(0);
  } else {
    if constexpr (kind == TargetKind::index_per_row) {
      const int64_t t = r.index(0);
      if (t < kTargetMin<L> || t >= r.cols) return bad_row();
    }
    if (!p.backward) return L::template forward<M>(ctx, r, p);
    L::template backward<M>(ctx, r, p, go);
    return M(0);
  }
}

/// Everything a launch needs: rows.data by operand of the op (forward:
/// inputs then out; backward: grad_output, inputs, then the gradients);
/// `scalar_out` / `scalar_grad` stand for out / grad_output when reduced.
struct RowLossLaunch {
  rows::RowLaunch rows;
  void* scalar_out = nullptr;
  const void* scalar_grad = nullptr;
  void* workspace = nullptr;  ///< CUDA: the per-row losses (f32; f64 for f64), then C bytes per row (index lists)
};

using RowFn = Status (*)(const RowLossLaunch&, const RowParams&, CUstream_st*);

/// The row `off` of every operand of a launch.
template <class L, class T, class Index>
BCD_HD RowOperands<T, Index> bind_row(const rows::RowLaunch& l, const int64_t* off, const RowParams& p) {
  RowOperands<T, Index> r;
  const int in = p.backward ? 1 : 0, grad = 1 + L::meta.inputs;
  for (int k = 0; k < L::meta.grads; ++k) {
    r.x[k] = reinterpret_cast<const T*>(l.data[in + k]) + off[in + k];
    r.sx[k] = l.inner.stride[in + k][0];
    if (p.backward) {
      r.g[k] = reinterpret_cast<T*>(l.data[grad + k]) + off[grad + k];
      r.sg[k] = l.inner.stride[grad + k][0];
    }
  }
  if constexpr (L::meta.target != TargetKind::none) {
    const int s = in + L::meta.grads;
    r.target = reinterpret_cast<const Index*>(l.data[s]) + off[s];
    r.st = l.inner.stride[s][0];
  }
  if (L::meta.inputs > L::meta.grads + 1 && p.weighted) {
    const int s = in + L::meta.grads + 1;
    r.weight = reinterpret_cast<const T*>(l.data[s]) + off[s];
    r.sw = l.inner.stride[s][0];
  }
  r.cols = l.cols;
  return r;
}

}  // namespace baracuda::loss
