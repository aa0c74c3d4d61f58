// torus/comm/backends.h — which comm backends this build of Torus holds.
//
// Backends register themselves (Note [Backend registration] in
// src/comm/backend_registry.h): each backend's own file adds its factory to
// the registry, and the build compiles only the backends it was configured
// with. Code and tests ask here what exists, never a build option; what a
// backend can do is its own capability query (Backend::supports).
//
// Names: "mpi" and "ofi" (host backends; TORUS_BACKEND chooses one),
// "nccl" (CUDA device memory, made by the bootstrap when a GPU is visible),
// "neuron" and "ofi-neuron" (Neuron device memory, made by name). Thread
// safe; the answers never change during a process.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace torus::comm {

// Whether a backend of this name is built into this library. Never throws.
bool backend_registered(std::string_view name) noexcept;
// The names of every backend built in, in registration order.
std::vector<std::string> registered_backends();

}  // namespace torus::comm
