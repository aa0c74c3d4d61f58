// torus/run/registry.h — the model registry: a run's --model (a preset or a
// Hugging Face directory) and shape options to a model of the engine's seam.
#pragma once

#include <memory>

#include "torus/engine/model.h"
#include "torus/run/run_config.h"

namespace torus::run {

// The model named by config.model (a preset, model_presets.h), with each
// shape option the config sets (non-zero: --layers, --hidden, --heads,
// --kv-heads, --ffn, --vocab, --rope-theta) overriding the preset's; the
// context is the preset's or --seq, whichever is longer; --precision picks
// the parameter dtype. Throws InvalidArgument for an unknown model or bad
// sizes. The only place that maps a name to a model
// (src/run/registry.cpp).
std::shared_ptr<engine::Model> make_model(const RunConfig& config);

}  // namespace torus::run
