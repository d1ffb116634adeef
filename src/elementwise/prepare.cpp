#include "elementwise/prepare.hpp"

#include <cstdlib>

namespace baracuda::ew {
namespace {

/// Operand strides aligned to the iteration shape (broadcast dims get stride
/// 0), innermost dim first.
Problem align_operands(std::span<const int64_t> iteration, std::span<const TensorView* const> views) {
  Problem p;
  const int rank = static_cast<int>(iteration.size());
  p.rank = rank;
  p.n_operands = static_cast<int>(views.size());
  for (int d = 0; d < rank; ++d) p.shape[d] = iteration[rank - 1 - d];
  for (int k = 0; k < p.n_operands; ++k) {
    const TensorView& v = *views[k];
    p.data[k] = static_cast<char*>(v.data);
    for (int d = 0; d < rank; ++d) {
      int vd = (rank - 1 - d) - (rank - v.rank);
      p.stride[k][d] = (vd < 0 || v.shape[vd] == 1) ? 0 : v.stride[vd];
    }
  }
  return p;
}

}  // namespace

void drop_unit_dims(Problem& p) {
  int out = 0;
  for (int d = 0; d < p.rank; ++d) {
    if (p.shape[d] == 1) continue;
    p.shape[out] = p.shape[d];
    for (int k = 0; k < p.n_operands; ++k) p.stride[k][out] = p.stride[k][d];
    ++out;
  }
  p.rank = out;
}

/// Walks dims where operand 0 (an output) has a negative stride backwards in
/// every operand, so reversed layouts become forward ones.
void flip_negative_dims(Problem& p, std::span<const size_t> elem_bytes) {
  for (int d = 0; d < p.rank; ++d) {
    if (p.stride[0][d] >= 0) continue;
    for (int k = 0; k < p.n_operands; ++k) {
      p.data[k] += p.stride[k][d] * (p.shape[d] - 1) * static_cast<int64_t>(elem_bytes[k]);
      p.stride[k][d] = -p.stride[k][d];
    }
  }
}

/// Orders dims innermost-first by stride (outputs decide first), so that any
/// permutation shared by the operands iterates memory in order.
void sort_dims(Problem& p) {
  auto inner_first = [&](int a, int b) {
    for (int k = 0; k < p.n_operands; ++k) {
      int64_t sa = std::llabs(p.stride[k][a]), sb = std::llabs(p.stride[k][b]);
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa < sb;
    }
    return false;
  };
  auto swap_dims = [&](int a, int b) {
    std::swap(p.shape[a], p.shape[b]);
    for (int k = 0; k < p.n_operands; ++k) std::swap(p.stride[k][a], p.stride[k][b]);
  };
  for (int i = 1; i < p.rank; ++i)
    for (int j = i; j > 0 && inner_first(j, j - 1); --j) swap_dims(j, j - 1);
}

void coalesce(Problem& p) {
  if (p.rank == 0) return;
  int out = 0;
  for (int d = 1; d < p.rank; ++d) {
    bool mergeable = true;
    for (int k = 0; k < p.n_operands; ++k)
      mergeable = mergeable && p.stride[k][d] == p.stride[k][out] * p.shape[out];
    if (mergeable) {
      p.shape[out] *= p.shape[d];
    } else {
      ++out;
      p.shape[out] = p.shape[d];
      for (int k = 0; k < p.n_operands; ++k) p.stride[k][out] = p.stride[k][d];
    }
  }
  p.rank = out + 1;
}

namespace {

Problem prepare(std::span<const int64_t> iteration, std::span<const TensorView* const> views) {
  Problem p = align_operands(iteration, views);
  std::array<size_t, kMaxOperands> bytes{};
  for (size_t k = 0; k < views.size(); ++k) bytes[k] = dtype_size(views[k]->dtype);
  drop_unit_dims(p);
  flip_negative_dims(p, std::span<const size_t>(bytes.data(), views.size()));
  sort_dims(p);
  coalesce(p);
  if (p.rank == 0) {  // a single element
    p.rank = 1;
    p.shape[0] = 1;
    for (int k = 0; k < p.n_operands; ++k) p.stride[k][0] = 1;
  }
  return p;
}

/// Splits a prepared problem into the dims operand 0 keeps and the dims it
/// sums over (stride 0).
Launch split_reduction(const Problem& p, int output_index) {
  Launch l;
  l.reduce = true;
  l.output_index = output_index;
  l.kept.n_operands = l.reduced.n_operands = p.n_operands;
  for (int k = 0; k < p.n_operands; ++k) l.kept.data[k] = l.reduced.data[k] = p.data[k];
  for (int d = 0; d < p.rank; ++d) {
    Problem& dst = (p.stride[0][d] == 0 && p.shape[d] > 1) ? l.reduced : l.kept;
    dst.shape[dst.rank] = p.shape[d];
    for (int k = 0; k < p.n_operands; ++k) dst.stride[k][dst.rank] = p.stride[k][d];
    ++dst.rank;
  }
  return l;
}

}  // namespace

LaunchList plan_launches(std::span<const int64_t> iteration, std::span<const TensorView> outputs,
                         std::span<const TensorView> inputs) {
  LaunchList list;
  bool any_reduced = false;
  for (const auto& out : outputs) any_reduced = any_reduced || out.shape_vec() != Shape(iteration.begin(), iteration.end());
  std::array<const TensorView*, kMaxOperands> views{};
  if (!any_reduced) {
    size_t n = 0;
    for (const auto& v : outputs) views[n++] = &v;
    for (const auto& v : inputs) views[n++] = &v;
    list.launches[0].kept = prepare(iteration, std::span(views.data(), n));
    list.count = 1;
    return list;
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    size_t n = 0;
    views[n++] = &outputs[j];
    for (const auto& v : inputs) views[n++] = &v;
    list.launches[list.count++] = split_reduction(prepare(iteration, std::span(views.data(), n)), static_cast<int>(j));
  }
  return list;
}

}  // namespace baracuda::ew
