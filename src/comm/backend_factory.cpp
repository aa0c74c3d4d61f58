// Maps a host backend name onto the backend built into this library.
#include "torus/comm/context.h"
#include "torus/config.h"

#include "core/log.h"
#if TORUS_WITH_MPI
#include "comm/mpi/mpi_backend.h"
#endif
#if TORUS_WITH_OFI
#include "comm/ofi/ofi_backend.h"
#endif
#if TORUS_WITH_NEURON
#include "comm/neuron/neuron_backend.h"
#endif

namespace torus::comm {

std::vector<std::string> Context::available_host_backends() {
  std::vector<std::string> names;
#if TORUS_WITH_MPI
  names.emplace_back("mpi");
#endif
#if TORUS_WITH_OFI
  names.emplace_back("ofi");
#endif
  return names;
}

BackendPtr create_world_backend(const std::string& name, const BackendInit& init) {
#if TORUS_WITH_MPI
  if (name == "mpi") return create_mpi_world_backend(init);
#endif
#if TORUS_WITH_OFI
  if (name == "ofi") return create_ofi_world_backend(init);
#endif
#if TORUS_WITH_NEURON
  // A device backend (Neuron device memory), not a host backend: not listed
  // in available_host_backends().
  if (name == "neuron") return create_neuron_world_backend(init);
#endif
#if TORUS_WITH_NEURON && TORUS_WITH_OFI
  // The ofi backend on Neuron device memory (Note [Device buffers] in
  // src/comm/ofi/device_ops.cpp): every op, including those the runtime's
  // collectives lack (broadcast, all-to-all, send/recv).
  if (name == "ofi-neuron") {
    ofi::OfiOptions options = ofi::OfiOptions::from_env();
    options.memory = DeviceType::kNeuron;
    return ofi::create_world_backend(init, options);
  }
#endif
  throw Unsupported(fmt::format("host backend '{}' is not built into this Torus (built: {})", name,
                                fmt::join(Context::available_host_backends(), ", ")));
}

}  // namespace torus::comm
