#include "gemm/problem.hpp"

#include <algorithm>
#include <vector>

#include "core/errors.hpp"

namespace baracuda::gemm {

const char* activation_name(Activation act) {
  static constexpr const char* names[kActivations] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
  const int i = static_cast<int>(act);
  return i >= 0 && i < kActivations ? names[i] : "?";
}

GemmTable& host_gemms() {
  static GemmTable table;
  return table;
}
GemmTable& cuda_gemms() {
  static GemmTable table;
  return table;
}

TensorView as_matrix(const TensorView& v, bool left) {
  if (v.rank != 1) return v;
  return unsqueezed(v, left ? 0 : 1);
}

TensorView transposed(const TensorView& v) {
  TensorView t = v;
  std::swap(t.shape[v.rank - 1], t.shape[v.rank - 2]);
  std::swap(t.stride[v.rank - 1], t.stride[v.rank - 2]);
  return t;
}

TensorView unsqueezed(const TensorView& v, int dim) {
  TensorView t = v;
  for (int i = v.rank; i > dim; --i) t.shape[i] = v.shape[i - 1], t.stride[i] = v.stride[i - 1];
  t.shape[dim] = 1;
  t.stride[dim] = 0;
  t.rank = v.rank + 1;
  return t;
}

namespace {

enum Which { kA, kB, kC, kD, kOperands };

/// One batch dim of the product: its size, each operand's stride, and
/// whether D lacks it (it is summed).
struct Dim {
  int64_t size;
  int64_t stride[kOperands];
  bool reduced;
};

/// Size and stride of batch dim `i` (of `batch`, outermost first) of a view
/// aligned right; size-1 and missing dims broadcast (stride 0).
std::pair<int64_t, int64_t> batch_dim(const TensorView& v, int i, int batch) {
  const int j = i - (batch - (v.rank - 2));
  if (j < 0 || v.shape[j] == 1) return {1, 0};
  return {v.shape[j], v.stride[j]};
}

/// Merges adjacent dims of one kind that walk every operand as a single dim.
std::vector<Dim> merged(const std::vector<Dim>& dims) {
  std::vector<Dim> out;
  for (const Dim& inner : dims) {
    if (!out.empty() && out.back().reduced == inner.reduced) {
      Dim& outer = out.back();
      bool fits = true;
      for (int o = 0; o < kOperands; ++o) fits = fits && outer.stride[o] == inner.stride[o] * inner.size;
      if (fits) {
        outer.size *= inner.size;
        for (int o = 0; o < kOperands; ++o) outer.stride[o] = inner.stride[o];
        continue;
      }
    }
    out.push_back(inner);
  }
  return out;
}

void set_matrix(Operand& o, const TensorView& v) {
  o.data = static_cast<char*>(v.data);
  o.row_stride = v.stride[v.rank - 2];
  o.col_stride = v.stride[v.rank - 1];
}

/// Folds the innermost batch dims into M when B and the bias do not vary
/// over them and A, C and D step over them as over M's rows (one large GEMM
/// instead of a batch: linear over [..., K] inputs); reduction dims fold into
/// K alike. A size-1 M or K takes the dim's stride as its own.
void fold(Problem& p) {
  while (p.batch_rank > 0) {
    const int i = p.batch_rank - 1;
    if (p.b.batch_stride[i] != 0) break;
    if (p.m == 1) {
      p.a.row_stride = p.a.batch_stride[i], p.d.row_stride = p.d.batch_stride[i], p.c.row_stride = p.c.batch_stride[i];
    }
    const bool fits = p.a.batch_stride[i] == p.a.row_stride * p.m && p.d.batch_stride[i] == p.d.row_stride * p.m &&
                      (!p.has_c || p.c.batch_stride[i] == p.c.row_stride * p.m);
    if (!fits) break;
    p.m *= p.batch_shape[i];
    --p.batch_rank;
  }
  while (p.red_rank > 0) {
    const int i = p.red_rank - 1;
    if (p.k == 1) p.a.col_stride = p.a.red_stride[i], p.b.row_stride = p.b.red_stride[i];
    if (p.a.red_stride[i] != p.a.col_stride * p.k || p.b.red_stride[i] != p.b.row_stride * p.k) break;
    p.k *= p.red_shape[i];
    --p.red_rank;
  }
}

Result<Problem> bind(const TensorView& d, const TensorView& a, const TensorView& b, const TensorView* c) {
  if (a.rank < 2 || b.rank < 2 || d.rank < 2)
    return internal_error("gemm: operands must be matrices (ranks ", a.rank, ", ", b.rank, " -> ", d.rank, ")");
  Problem p;
  p.in_dtype = a.dtype;
  p.out_dtype = d.dtype;
  p.m = a.shape[a.rank - 2];
  p.k = a.shape[a.rank - 1];
  p.n = b.shape[b.rank - 1];
  if (b.shape[b.rank - 2] != p.k || d.shape[d.rank - 2] != p.m || d.shape[d.rank - 1] != p.n)
    return internal_error("gemm: operand shapes ", shape_str(a.shape_vec()), " @ ", shape_str(b.shape_vec()), " -> ",
                          shape_str(d.shape_vec()), " do not compose");
  set_matrix(p.a, a);
  set_matrix(p.b, b);
  set_matrix(p.d, d);
  if (c) set_matrix(p.c, *c), p.has_c = true;
  const int batch = std::max(a.rank, b.rank) - 2;
  if (d.rank - 2 > batch || (c && c->rank != d.rank))
    return internal_error("gemm: output rank ", d.rank, " exceeds the product's");
  std::vector<Dim> dims;
  for (int i = 0; i < batch; ++i) {
    const auto [na, sa] = batch_dim(a, i, batch);
    const auto [nb, sb] = batch_dim(b, i, batch);
    const auto [nd, sd] = batch_dim(d, i, batch);
    const int64_t np = na == 1 ? nb : na;
    if ((na != 1 && na != np) || (nb != 1 && nb != np))
      return internal_error("gemm: batch dims ", na, " and ", nb, " do not broadcast");
    if (np == 1) continue;
    Dim dim{np, {sa, sb, 0, 0}, nd != np};
    if (nd != np && nd != 1) return internal_error("gemm: output batch dim ", nd, " is neither ", np, " nor 1");
    if (!dim.reduced) {
      dim.stride[kD] = sd;
      if (c) dim.stride[kC] = batch_dim(*c, i, batch).second;
    }
    dims.push_back(dim);
  }
  for (const Dim& dim : merged(dims)) {
    if (dim.reduced) {
      const int r = p.red_rank++;
      p.red_shape[r] = dim.size;
      p.a.red_stride[r] = dim.stride[kA], p.b.red_stride[r] = dim.stride[kB];
    } else {
      const int r = p.batch_rank++;
      p.batch_shape[r] = dim.size;
      p.a.batch_stride[r] = dim.stride[kA], p.b.batch_stride[r] = dim.stride[kB];
      p.c.batch_stride[r] = dim.stride[kC], p.d.batch_stride[r] = dim.stride[kD];
    }
  }
  fold(p);
  return p;
}

/// `v` viewed with `shape` (rank >= v's, aligned right): size-1 and missing dims broadcast.
TensorView expanded(const TensorView& v, const TensorView& like) {
  TensorView e = like;
  e.data = v.data;
  e.dtype = v.dtype;
  for (int i = 0; i < like.rank; ++i) {
    const int j = i - (like.rank - v.rank);
    e.stride[i] = j < 0 || v.shape[j] == 1 ? 0 : v.stride[j];
  }
  return e;
}

}  // namespace

Result<Problem> bind_product(const TensorView& d, const TensorView& a, const TensorView& b) {
  return bind(d, a, b, nullptr);
}

Result<Problem> bind_product(const TensorView& d, const TensorView& a, const TensorView& b, const TensorView& c) {
  const TensorView e = expanded(c, d);
  return bind(d, a, b, &e);
}

void bind_bias(Problem& p, const TensorView& bias) {
  p.bias.data = static_cast<char*>(bias.data);
  p.bias.col_stride = bias.stride[0];
  p.bias_dtype = bias.dtype;
}

}  // namespace baracuda::gemm
