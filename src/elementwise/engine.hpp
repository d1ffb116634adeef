// The elementwise engine shared by the CUDA launcher and the host reference:
// type-erased problems (prepared on the host), offset calculation, and the
// per-element apply / reduce steps that call an op's functor.
#pragma once

#include <utility>

#include "elementwise/functors.hpp"

struct CUstream_st;

namespace baracuda::ew {

inline constexpr int kMaxOperands = 8;

/// Operands over a common iteration shape; outputs first. Dim 0 is the
/// innermost (fastest) dimension; strides are in elements.
struct Problem {
  int rank = 0;
  int n_operands = 0;
  int64_t shape[kMaxRank] = {};
  char* data[kMaxOperands] = {};
  int64_t stride[kMaxOperands][kMaxRank] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }
};

/// One kernel launch: pointwise over `kept` (every output written once), or,
/// when `reduce`, operand 0 is output `output_index` of the functor and each
/// of its elements sums the functor over the `reduced` dims (a gradient
/// summed over broadcast dimensions).
struct Launch {
  bool reduce = false;
  int output_index = 0;
  Problem kept;
  Problem reduced;  // same operands; only rank/shape/stride are used
};

using LaunchFn = Status (*)(const Launch&, const Params&, CUstream_st*);

/// Functors whose outputs may be summed over broadcast dims (gradients).
template <class Fn>
concept Reducible = requires { Fn::kSumsOverBroadcast; };

/// Element offsets of N operands for a linear index over a Problem's shape.
template <int N, class Index>
struct OffsetCalc {
  int rank = 0;
  Index shape[kMaxRank];
  Index stride[N][kMaxRank];

  OffsetCalc() = default;
  explicit OffsetCalc(const Problem& p) : rank(p.rank) {
    for (int d = 0; d < kMaxRank; ++d) {
      shape[d] = d < p.rank ? static_cast<Index>(p.shape[d]) : 1;
      for (int k = 0; k < N; ++k) stride[k][d] = d < p.rank ? static_cast<Index>(p.stride[k][d]) : 0;
    }
  }

  BCD_HD void get(Index linear, Index (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxRank; ++d) {
      if (d == rank) break;
      Index i = linear % shape[d];
      linear /= shape[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * stride[k][d];
    }
  }
};

template <class R>
struct IsGrads : std::false_type {};
template <class M, int K>
struct IsGrads<Grads<M, K>> : std::true_type {};

/// Output j of a functor result (a scalar, or Grads for several outputs).
template <class R>
BCD_HD auto component(const R& r, [[maybe_unused]] int j) {
  if constexpr (IsGrads<R>::value) {
    auto v = r.v[0];
#pragma unroll
    for (int k = 1; k < int(sizeof(r.v) / sizeof(r.v[0])); ++k)
      if (j == k) v = r.v[k];
    return v;
  } else {
    return r;
  }
}

template <class T>
BCD_HD const T& at(char* const base, int64_t off) {
  return reinterpret_cast<const T*>(base)[off];
}

/// Evaluates the functor at one element and stores every output.
template <class Out, int NOut, class... Ins, class Fn, class Index, size_t... I>
BCD_HD void apply_at(const Fn& fn, char* const* data, const Index* off, std::index_sequence<I...>) {
  auto r = fn(at<Ins>(data[NOut + I], off[NOut + I])...);
#pragma unroll
  for (int j = 0; j < NOut; ++j) reinterpret_cast<Out*>(data[j])[off[j]] = convert<Out>(component(r, j));
}

/// Sums output `j` of the functor over the reduced dims, starting from the
/// kept offsets `base`, and stores it at operand 0.
template <class Out, class... Ins, class Fn, size_t... I>
BCD_HD void reduce_at(const Fn& fn, int j, char* const* data, const int64_t* base,
                      const OffsetCalc<1 + sizeof...(Ins), int64_t>& red, int64_t red_numel,
                      std::index_sequence<I...>) {
  constexpr int N = 1 + sizeof...(Ins);
  using Acc = decltype(component(fn(at<Ins>(data[1 + I], 0)...), 0));
  Acc acc = Acc(0);
  for (int64_t r = 0; r < red_numel; ++r) {
    int64_t off[N];
    red.get(r, off);
    acc += component(fn(at<Ins>(data[1 + I], base[1 + I] + off[1 + I])...), j);
  }
  reinterpret_cast<Out*>(data[0])[base[0]] = convert<Out>(acc);
}

// ---------------------------------------------------------------- functor wrappers

template <class Op, class M, class... Args>
concept HasDeriv = requires(M x, const Params& p) { Op::deriv(x, p); };

/// Forward: converts each input to its math type and calls Op::fwd. Ops
/// whose result depends on the storage format (nextafter) get storage values.
template <class Op, bool Host, class... Ins>
struct Forward {
  Params p;
  BCD_HD auto operator()(Ins... x) const {
    if constexpr (requires { Op::kStorageMath; }) return Op::fwd(x..., p);
    else return Op::fwd(convert<math_t<Ins, Host>>(x)..., p);
  }
};

/// Fill: no inputs; the value in the output's math type.
template <class Op, bool Host, class Out>
struct FillFn {
  Params p;
  BCD_HD auto operator()() const { return Op::template fwd<math_t<Out, Host>>(p); }
};

/// Backward: (dy, forward inputs...) -> gradients of every input, in the
/// math type of T (the gradient dtype).
template <class Op, bool Host, class T, class... Ins>
struct Backward {
  Params p;
  using M = math_t<T, Host>;
  static constexpr bool kSumsOverBroadcast = true;  // gradients may be reduced
  BCD_HD auto operator()(T dy, Ins... x) const {
    if constexpr (sizeof...(Ins) == 1 && HasDeriv<Op, M>) {
      return convert<M>(dy) * Op::deriv(convert<M>(x)..., p);
    } else {
      return Op::template bwd<M>(convert<M>(dy), convert<math_t<Ins, Host>>(x)..., p);
    }
  }
};

}  // namespace baracuda::ew
