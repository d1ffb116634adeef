// Row problems for the row-wise families (softmax, normalization): operands
// split into independent rows (the outer dims, any strides) of `cols`
// elements (the inner dims). Operands that are per-row statistics (mean,
// rstd) or per-column parameters (weight, bias) get stride 0 along the dims
// they do not have.
#pragma once

#include <array>

#include "elementwise/prepare.hpp"

namespace baracuda::rows {

using ew::OffsetCalc;
using ew::Problem;

inline constexpr int kMaxOperands = 8;

struct RowLaunch {
  int n_operands = 0;
  char* data[kMaxOperands] = {};
  Problem outer;  ///< the rows: one index per row
  Problem inner;  ///< the columns of one row
  int64_t rows = 0, cols = 0;
  /// Every operand walks a row with stride 0 or 1 (inner coalesced to rank 1).
  bool unit_inner = false;
  void* workspace = nullptr;
};

/// Where an operand's dims sit in the full [outer..., inner...] shape.
enum class Role : uint8_t {
  full,      ///< the input's shape
  per_row,   ///< the outer dims only (a statistic per row)
  per_col,   ///< the inner dims only (a weight or bias)
};

/// The view with axis `dim` moved last (a row along `dim`); rank 0 unchanged.
inline TensorView move_axis_last(TensorView v, int dim) {
  if (v.rank == 0) return v;
  const TensorView src = v;
  for (int a = 0, k = 0; a < src.rank; ++a)
    if (a != dim) v.shape[k] = src.shape[a], v.stride[k] = src.stride[a], ++k;
  v.shape[src.rank - 1] = src.shape[dim];
  v.stride[src.rank - 1] = src.stride[dim];
  return v;
}

inline Shape move_axis_last(Shape shape, int dim) {
  if (shape.empty()) return shape;
  const int64_t n = shape[dim];
  shape.erase(shape.begin() + dim);
  shape.push_back(n);
  return shape;
}

/// `shape` is the full shape; its last `inner_dims` dims form a row. Rows are
/// numbered in the order that walks memory best, or with `logical_rows` in
/// row-major order of the outer dims (a row's index then names it, as
/// counter-based noise needs).
inline RowLaunch make_rows(std::span<const int64_t> shape, int inner_dims, std::span<const TensorView> views,
                           std::span<const Role> roles, bool logical_rows = false) {
  RowLaunch l;
  const int rank = static_cast<int>(shape.size());
  const int outer_dims = rank - inner_dims;
  l.n_operands = static_cast<int>(views.size());
  Problem& o = l.outer;
  Problem& in = l.inner;
  o.n_operands = in.n_operands = l.n_operands;
  for (int k = 0; k < l.n_operands; ++k) o.data[k] = in.data[k] = l.data[k] = static_cast<char*>(views[k].data);
  for (int a = rank - 1; a >= 0; --a) {  // innermost first
    const bool is_inner = a >= outer_dims;
    Problem& p = is_inner ? in : o;
    p.shape[p.rank] = shape[a];
    for (int k = 0; k < l.n_operands; ++k) {
      const TensorView& v = views[k];
      int64_t stride = 0;
      if (roles[k] == Role::full) stride = v.stride[a];
      else if (roles[k] == Role::per_row && !is_inner) stride = v.stride[a];
      else if (roles[k] == Role::per_col && is_inner) stride = v.stride[a - outer_dims];
      p.stride[k][p.rank] = shape[a] == 1 ? 0 : stride;
    }
    ++p.rank;
  }
  ew::drop_unit_dims(o);
  if (!logical_rows) ew::sort_dims(o);
  ew::coalesce(o);
  ew::drop_unit_dims(in);
  ew::coalesce(in);  // keeps the logical column order
  l.rows = o.numel();
  l.cols = in.numel();
  if (in.rank == 0) {  // one column
    in.rank = 1;
    in.shape[0] = 1;
    for (int k = 0; k < l.n_operands; ++k) in.stride[k][0] = 0;
  }
  l.unit_inner = in.rank == 1;
  for (int k = 0; k < l.n_operands && l.unit_inner; ++k)
    l.unit_inner = in.stride[k][0] == 0 || in.stride[k][0] == 1 || in.shape[0] == 1;
  return l;
}

/// The rows along axis `dim` of operands that all have `shape` (rank 0: one
/// row of one element): each view with `dim` moved last, outputs first, at
/// most kMaxOperands in all.
inline RowLaunch rows_along(const Shape& shape, int dim, std::span<const TensorView> outputs,
                            std::span<const TensorView> inputs, bool logical_rows = false) {
  std::array<TensorView, kMaxOperands> views;
  std::array<Role, kMaxOperands> roles;
  roles.fill(Role::full);
  size_t n = 0;
  for (const auto& v : outputs) views[n++] = move_axis_last(v, dim);
  for (const auto& v : inputs) views[n++] = move_axis_last(v, dim);
  return make_rows(move_axis_last(shape, dim), shape.empty() ? 0 : 1, std::span(views.data(), n),
                   std::span(roles.data(), n), logical_rows);
}

}  // namespace baracuda::rows
