// Smallest Torus program: every rank contributes rank+1; the all_reduce sum
// must be n(n+1)/2 on every rank. Run: mpirun -np 2 ./torus_consumer
#include <ATen/Functions.h>

#include <cstdio>

#include <torus/comm/process_group.h>
#include <torus/core/error.h>

int main() {
  try {
    auto world = torus::init();
    const int n = world->size();
    at::Tensor t = at::full({8}, static_cast<float>(world->rank() + 1));
    world->all_reduce(t)->wait();
    const float expected = n * (n + 1) / 2.0f;
    const bool ok = t.eq(expected).all().item<bool>();
    std::printf("rank %d/%d: all_reduce sum = %.1f (expected %.1f) %s\n", world->rank(), n, t[0].item<float>(),
                expected, ok ? "OK" : "WRONG");
    return ok ? 0 : 1;
  } catch (const torus::Error& e) {
    std::fprintf(stderr, "torus error: %s\n", e.what());
    return 2;
  }
}
