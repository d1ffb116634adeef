// Finite differences for the host backward tests: a backward op's gradient
// against the central difference of the forward op's loss sum_i g_i y_i.
#pragma once

#include <cstddef>
#include <vector>

namespace baracuda::testing_support {

/// sum_i g[i] * y[i]: the loss whose gradient with respect to y is g.
inline double weighted_sum(const std::vector<double>& g, const std::vector<double>& y) {
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
  return l;
}

/// (f(x + h e_i) - f(x - h e_i)) / 2h: the derivative of f along element i of x.
template <class F>
double central_difference(F&& f, std::vector<double> x, size_t i, double h = 1e-6) {
  const double xi = x[i];
  x[i] = xi + h;
  const double up = f(x);
  x[i] = xi - h;
  const double down = f(x);
  return (up - down) / (2 * h);
}

}  // namespace baracuda::testing_support
