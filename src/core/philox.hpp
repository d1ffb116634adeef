// Philox-4x32 (Salmon et al. 2011), the counter-based generator every
// backend shares (attention dropout, gumbel_softmax): a draw is a pure
// function of (key, counter), so the host and CUDA give the same bits.
// Ten rounds, the published default, unless a caller names fewer.
#pragma once

#include <cstdint>

#include "core/dtype_traits.hpp"

namespace baracuda {

/// The four 32-bit words of Philox-4x32 with kRounds rounds at counter (c0, c1, c2, c3).
struct PhiloxWords {
  uint32_t v[4];
};
template <int kRounds = 10>
BCD_HD PhiloxWords philox(uint64_t key, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  static_assert(kRounds >= 7, "Salmon et al. 2011 rate Philox-4x32 Crush-resistant from 7 rounds");
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1), c3 = uint32_t(p0), c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// A uniform in (0, 1) from 32 random bits: the top 23 bits k give
/// u = (2k + 1) / 2^24, in [2^-24, 1 - 2^-24]. u is exact in f32 and f64 (24
/// significant bits), so every backend sees the same u whatever its math type.
template <class M>
BCD_HD M uniform_open01(uint32_t bits) {
  return M(2 * (bits >> 9) + 1) * M(0x1p-24);
}

}  // namespace baracuda
