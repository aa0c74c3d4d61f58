// Private: the gradient-ready hook of the data-parallel wrappers (ddp.cpp,
// zero.cpp). Installed as a post hook of a parameter's AccumulateGrad node
// (Node::add_post_hook), it calls `fn` once that node has run: the
// parameter's gradient for this backward is complete. It runs on the thread
// of the autograd engine that ran the node, inside backward; `fn` must not
// throw unless the backward is meant to fail.
#pragma once

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace torus::dp {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace torus::dp
