// Callbacks for the end of the outermost backward (backward_callback.h).
#include "torus/parallel/backward_callback.h"

#include <torch/csrc/autograd/engine.h>

#include <exception>
#include <utility>
#include <vector>

namespace torus::parallel {
namespace {

thread_local int t_depth = 0;
thread_local std::vector<std::function<void()>> t_kept;

}  // namespace

void queue_after_backward(std::function<void()> fn) {
  if (t_depth > 0) {
    t_kept.push_back(std::move(fn));
    return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

InnerBackwardScope::InnerBackwardScope() : uncaught_(std::uncaught_exceptions()) { ++t_depth; }

InnerBackwardScope::~InnerBackwardScope() noexcept(false) {
  if (--t_depth > 0) return;
  std::vector<std::function<void()>> kept = std::move(t_kept);
  t_kept.clear();
  if (std::uncaught_exceptions() > uncaught_) return;  // unwinding: the outer backward fails too
  for (auto& fn : kept) torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

int inner_backward_depth() { return t_depth; }

}  // namespace torus::parallel
