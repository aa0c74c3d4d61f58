// make_optimizer: an optimizer from an OptimizerSpec (a command line, a config).
#include "core/log.h"
#include "torus/optim/adam.h"
#include "torus/optim/adamw.h"
#include "torus/optim/cpu_adam.h"
#include "torus/optim/optimizer.h"
#include "torus/optim/sgd.h"

namespace torus::optim {
namespace {

SGDOptions sgd_options(const OptimizerSpec& s) {
  return {.lr = s.lr,
          .momentum = s.momentum,
          .dampening = s.dampening,
          .nesterov = s.nesterov,
          .weight_decay = s.weight_decay};
}

AdamOptions adam_options(const OptimizerSpec& s) {
  return {.lr = s.lr, .beta1 = s.beta1, .beta2 = s.beta2, .eps = s.eps, .weight_decay = s.weight_decay};
}

}  // namespace

void OptimizerSpec::validate() const {
  if (name == "sgd") {
    sgd_options(*this).validate();
  } else if (name == "adam" || name == "adamw" || name == "cpu_adam" || name == "cpu_adamw") {
    adam_options(*this).validate();
  } else {
    throw InvalidArgument(fmt::format("optimizer '{}' is not one of sgd, adam, adamw, cpu_adam, cpu_adamw", name));
  }
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<ParamGroup> groups) {
  spec.validate();
  if (spec.name == "sgd") return std::make_unique<SGD>(std::move(groups), sgd_options(spec), spec.options);
  if (spec.name == "adam") return std::make_unique<Adam>(std::move(groups), adam_options(spec), spec.options);
  if (spec.name == "cpu_adam") return std::make_unique<CpuAdam>(std::move(groups), adam_options(spec), spec.options);
  if (spec.name == "cpu_adamw") return std::make_unique<CpuAdamW>(std::move(groups), adam_options(spec), spec.options);
  return std::make_unique<AdamW>(std::move(groups), adam_options(spec), spec.options);
}

}  // namespace torus::optim
