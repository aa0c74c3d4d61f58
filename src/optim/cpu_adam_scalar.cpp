// The scalar path of the CPU Adam kernel (any CPU; the reference the vector
// paths must equal bit for bit).
#include "cpu_adam_math.h"

namespace torus::optim::cpu::detail {

void adam_range_scalar(const AdamConsts& c, const AdamSlice& s, int64_t begin, int64_t end) {
  dispatch(c, s, [&]<Dtype G, Dtype O, bool kOut, bool kDecoupled>() {
    adam_elements<G, O, kOut, kDecoupled>(c, s, begin, end);
  });
}

}  // namespace torus::optim::cpu::detail
