// torus/parallel/backward_callback.h — callbacks that run when the OUTERMOST
// backward pass ends, even when they are queued from inside a nested one.
//
// Note [Inner backward]: some autograd nodes run a backward of their own
// while the engine is executing theirs: activation recompute replays a
// block's forward and calls torch::autograd::backward on the replay
// (recompute.h); a deferring linear without a weight-gradient store
// accumulates its weight gradient the same way (weight_grad.h). The engine
// runs such a call re-entrantly as a NEW graph task on the same thread, and
// torch::autograd::Engine::queue_callback attaches a callback to the graph
// task that is current — the inner one. A callback meant for "the end of
// backward" (the DP wrapper's finish_grad_sync) would then run when the
// inner pass ends, while the outer pass still has gradients to produce.
//
// The rule: code that runs an inner backward from inside a node's backward
// holds an InnerBackwardScope around it; code that wants "the end of
// backward" calls queue_after_backward() instead of queue_callback().
// Inside a scope the callback is kept, and when the outermost scope closes
// (the inner pass has returned, the outer graph task is current again) it is
// queued on the outer graph task, so it runs when the whole backward ends.
//
// Threading: the depth and the kept callbacks are thread local. The engine
// runs a re-entrant backward on the thread of the node that started it, so a
// scope and the hooks inside its backward see the same state (CPU: the
// thread that called backward; CUDA: the device's autograd thread).
#pragma once

#include <functional>

namespace torus::parallel {

// Queues `fn` to run once the outermost backward pass on this thread ends
// (Engine::queue_callback on it). Outside any InnerBackwardScope this is
// exactly Engine::queue_callback. Must be called during a backward pass:
// throws (c10::Error, from the engine) when no backward runs on this thread.
void queue_after_backward(std::function<void()> fn);

// Marks an inner backward (Note [Inner backward]) on this thread while alive.
// Destruction of the outermost scope queues the callbacks kept meanwhile on
// the graph task that is then current; when the scope unwinds because of an
// exception they are dropped (the backward that would run them has failed).
// Not copyable; nest freely.
class InnerBackwardScope {
 public:
  InnerBackwardScope();
  ~InnerBackwardScope() noexcept(false);
  InnerBackwardScope(const InnerBackwardScope&) = delete;
  InnerBackwardScope& operator=(const InnerBackwardScope&) = delete;

 private:
  int uncaught_;
};

// Number of InnerBackwardScopes alive on this thread (0: not inside an inner backward).
int inner_backward_depth();

}  // namespace torus::parallel
