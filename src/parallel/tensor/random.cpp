// Seeds, generators and the dropout streams of tensor parallelism (random.h).
#include "torus/parallel/tensor/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "core/log.h"

namespace torus::tp {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t derive_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return splitmix64(seed ^ splitmix64(h));
}

at::Generator make_generator(uint64_t seed, c10::Device device) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator gen = at::globalContext().getAcceleratorHooksInterface(device.type()).getNewGenerator(device.index());
  gen.set_current_seed(seed);
  return gen;
}

RngTracker::RngTracker(uint64_t seed, int tp_rank, c10::Device device, int stage) {
  TORUS_CHECK(tp_rank >= 0 && stage >= 0, InvalidArgument, "RngTracker: tp_rank {} and stage {} must be >= 0", tp_rank,
              stage);
  const uint64_t base = derive_seed(seed, "dropout/stage/" + std::to_string(stage));
  replicated_ = make_generator(derive_seed(base, "replicated"), device);
  sharded_ = make_generator(derive_seed(base, "sharded/tp/" + std::to_string(tp_rank)), device);
}

RngTracker::State RngTracker::get_state() const {
  return {replicated_.get_state(), sharded_.get_state()};
}

void RngTracker::set_state(const State& state) {
  replicated_.set_state(state.replicated);
  sharded_.set_state(state.sharded);
}

at::Tensor dropout(const at::Tensor& x, double p, bool training, at::Generator& generator) {
  TORUS_CHECK(p >= 0.0 && p < 1.0, InvalidArgument, "dropout probability must be in [0, 1), got {}", p);
  if (!training || p == 0.0) return x;
  at::Tensor mask = at::empty_like(x, at::MemoryFormat::Contiguous).bernoulli_(1.0 - p, generator);
  return x * mask.mul_(1.0 / (1.0 - p));
}

}  // namespace torus::tp
