// The elementwise op lists by kind, and the one routine that instantiates
// every (op, dtype) kernel for a backend's launcher. Adding an op = its
// struct in functors.hpp + its name in one list below.
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "elementwise/engine.hpp"

namespace baracuda::ew {

/// Operand structure of a kind (what the kernel reads and writes).
enum class Kind : uint8_t {
  unary,      // x -> y                 bwd: (dy, x) -> dx
  predicate,  // x -> bool
  binary,     // (a, b) -> y            bwd: (dy, a, b) -> (da, db)
  compare,    // (a, b) -> bool
  ternary,    // (a, b, c) -> y         bwd: (dy, a, b, c) -> (da, db, dc)
  where,      // (cond, a, b) -> y      bwd: (dy, cond) -> (da, db)
  cast,       // x -> y of another dtype
  fill,       // () -> y
  gated,      // x = [a | b] along dim -> f(a, b)   bwd: (dy, x) -> dx
};

// clang-format off
using UnaryOps = TypeList<Neg, Abs, Sign, Square, Reciprocal, Cube, Sqrt, Rsqrt, Cbrt, Exp, Exp2, Expm1, Log, Log2,
    Log10, Log1p, Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Tanh, Asinh, Acosh, Atanh, Floor, Ceil, Round, Trunc,
    Frac, Relu, Relu6, Gelu, GeluTanh, Silu, Mish, Sigmoid, Softplus, Hardswish, Hardsigmoid, Hardtanh, Erf, Erfc,
    Lgamma, Digamma, Logit, Softsign, Tanhshrink, Selu, LeakyRelu, Elu, Celu, Hardshrink, Softshrink, Step,
    Threshold, PowScalar, Affine, BitwiseNot>;
using PredicateOps = TypeList<IsNan, IsInf, IsFinite, LogicalNot>;
using BinaryOps = TypeList<Add, Sub, Mul, Div, Pow, Atan2, Hypot, Copysign, Nextafter, Fmax, Fmin, Maximum, Minimum,
    FloorDivide, Fmod, Remainder, Prelu, BitwiseAnd, BitwiseOr, BitwiseXor, ShiftLeft, ShiftRight>;
using CompareOps = TypeList<Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, LogicalXor>;
using TernaryOps = TypeList<Clamp, Fma, Addcmul, Addcdiv, Lerp>;
using GatedOps = TypeList<Glu, Reglu, Swiglu, Geglu>;
// clang-format on

template <Set S>
struct SetTypes;
template <> struct SetTypes<Set::floating> { using type = FloatTypes; };
template <> struct SetTypes<Set::float_int> { using type = FloatIntTypes; };
template <> struct SetTypes<Set::integral> { using type = IntTypes; };
template <> struct SetTypes<Set::int_bool> { using type = IntBoolTypes; };
template <> struct SetTypes<Set::real> { using type = RealTypes; };
template <> struct SetTypes<Set::all> { using type = AllTypes; };


/// True when Op is offered for storage type T.
template <class Op, class T>
inline constexpr bool supports = Contains<T, typename SetTypes<Op::meta.dtypes>::type>::value;

// Note [Detecting gradients]: detect by call expressions. nvcc's device pass
// rejects taking the address of a __forceinline__ function template, so an
// address-based check silently differs between the host and device passes
// (host stubs registered for kernels that were never compiled).
template <class Op>
concept HasUnaryGrad = requires(double x, const Params& p) { Op::deriv(x, p); };
template <class Op>
concept HasBinaryGrad = requires(double x, const Params& p) { Op::template bwd<double>(x, x, x, p); };
template <class Op>
concept HasTernaryGrad = requires(double x, const Params& p) { Op::template bwd<double>(x, x, x, x, p); };
template <class Op>
inline constexpr bool differentiable = HasUnaryGrad<Op> || HasBinaryGrad<Op> || HasTernaryGrad<Op> || std::is_same_v<Op, Where>;

// ---------------------------------------------------------------- kernel tables


using KernelTable = LaunchTable<LaunchFn>;
KernelTable& host_kernels();
KernelTable& cuda_kernels();

/// Groups of kernels compiled together (one translation unit per group and
/// dtype list, so the CUDA build parallelises).
enum class Group : uint8_t { unary, unary_bwd, binary, binary_bwd, misc, cast };

/// Instantiates `L::launch<Out, NOut, Fn, Ins...>` for every op of the group
/// and every storage type T of `Types`, and records them in `table`.
template <class L, bool Host, Group G, class Types>
bool register_group(KernelTable& table) {
  auto add = [&]<class Out, int NOut, class Fn, class... Ins>(const char* name, DType primary, DType secondary) {
    table.add(launch_key(name, primary, secondary), &L::template launch<Out, NOut, Fn, Ins...>);
  };
  auto backward_name = [](const char* name) { return std::string(name) + "_backward"; };
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    constexpr DType d = dtype_of<T>;
    if constexpr (G == Group::unary) {
      for_each_type<UnaryOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>) add.template operator()<T, 1, Forward<Op, Host, T>, T>(Op::meta.name, d, d);
      });
    } else if constexpr (G == Group::unary_bwd) {
      for_each_type<UnaryOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T> && Contains<T, FloatTypes>::value && differentiable<Op>)
          add.template operator()<T, 1, Backward<Op, Host, T, T>, T, T>(backward_name(Op::meta.name).c_str(), d, d);
      });
    } else if constexpr (G == Group::binary) {
      for_each_type<BinaryOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>) add.template operator()<T, 1, Forward<Op, Host, T, T>, T, T>(Op::meta.name, d, d);
      });
    } else if constexpr (G == Group::binary_bwd) {
      if constexpr (Contains<T, FloatTypes>::value) {
        for_each_type<Concat<BinaryOps, GatedOps>::type>([&]<class Op>(TypeTag<Op>) {
          if constexpr (supports<Op, T> && differentiable<Op>)
            add.template operator()<T, 2, Backward<Op, Host, T, T, T>, T, T, T>(backward_name(Op::meta.name).c_str(), d, d);
        });
        for_each_type<TernaryOps>([&]<class Op>(TypeTag<Op>) {
          if constexpr (supports<Op, T>)
            add.template operator()<T, 3, Backward<Op, Host, T, T, T, T>, T, T, T, T>(
                backward_name(Op::meta.name).c_str(), d, d);
        });
        add.template operator()<T, 2, Backward<Where, Host, T, bool>, T, bool>("where_backward", d, d);
      }
    } else if constexpr (G == Group::misc) {
      for_each_type<PredicateOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>) add.template operator()<bool, 1, Forward<Op, Host, T>, T>(Op::meta.name, d, d);
      });
      for_each_type<CompareOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>)
          add.template operator()<bool, 1, Forward<Op, Host, T, T>, T, T>(Op::meta.name, d, d);
      });
      for_each_type<TernaryOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>)
          add.template operator()<T, 1, Forward<Op, Host, T, T, T>, T, T, T>(Op::meta.name, d, d);
      });
      for_each_type<GatedOps>([&]<class Op>(TypeTag<Op>) {
        if constexpr (supports<Op, T>) add.template operator()<T, 1, Forward<Op, Host, T, T>, T, T>(Op::meta.name, d, d);
      });
      add.template operator()<T, 1, Forward<Where, Host, bool, T, T>, bool, T, T>("where", d, d);
      add.template operator()<T, 1, FillFn<Fill, Host, T>>("fill", d, d);
    } else if constexpr (G == Group::cast) {
      for_each_type<AllTypes>([&]<class To>(TypeTag<To>) {
        add.template operator()<To, 1, Forward<Cast, Host, T>, T>("cast", d, dtype_of<To>);
      });
    }
  });
  return true;
}

}  // namespace baracuda::ew
