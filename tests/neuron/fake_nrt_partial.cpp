// A library that is not a usable Neuron runtime: it exports nrt_init and
// nrt_get_version but none of the tensor calls, as a wrong or truncated
// library would. Torus must refuse it, name what it lacks, report zero
// devices and never call into it further.
#include <cstddef>
#include <cstdint>
#include <cstdio>

extern "C" {
int nrt_init(int, const char*, const char*) {
  std::fprintf(stderr, "partial nrt: nrt_init must not be called\n");
  return 0;
}
int nrt_get_version(void*, size_t) { return 0; }
}
