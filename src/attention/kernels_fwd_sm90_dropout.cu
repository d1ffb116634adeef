// The Hopper forward's instances with dropout (Note [Hopper forward] in
// hopper_forward.cuh), apart from the plain ones so the two build in parallel.
#include "attention/hopper_forward.cuh"

namespace baracuda::attn::hopper {

template <class T, int kD, bool kTma>
Status launch_dropout(const TmaMaps& maps, const Problem& p, CUstream_st* stream) {
  return launch_kernel<T, kD, kTma, true>(maps, p, stream);
}

#define BARACUDA_HOPPER_DROPOUT(T, D)                                                         \
  template Status launch_dropout<T, D, true>(const TmaMaps&, const Problem&, CUstream_st*); \
  template Status launch_dropout<T, D, false>(const TmaMaps&, const Problem&, CUstream_st*);
BARACUDA_HOPPER_DROPOUT(__half, 64)
BARACUDA_HOPPER_DROPOUT(__half, 128)
BARACUDA_HOPPER_DROPOUT(__nv_bfloat16, 64)
BARACUDA_HOPPER_DROPOUT(__nv_bfloat16, 128)
#undef BARACUDA_HOPPER_DROPOUT

}  // namespace baracuda::attn::hopper
