// Private: the table the comm backends fill, and the choice of the world's
// backends from it.
//
// Note [Backend registration]: each backend's own file defines
//   void register_<name>_backend(BackendRegistry& registry);
// which adds a BackendFactory (its name, role, memory, how to tell whether it
// can serve a job, and how to make its world communicator) and, for a
// launcher's runtime such as MPI, a LauncherChannel. The build compiles a
// backend only when configured to, names it with torus_register_backend
// (src/CMakeLists.txt), and generates register_built_backends(), which calls
// the registration functions of those compiled, in that order. The registry
// runs it once, on the first lookup (thread safe), rather than relying on
// static initialisers that a linker may drop. Nothing else names a build
// option: the bootstrap, create_world_backend and the tests ask the registry
// (torus/comm/backends.h). Capabilities stay with the Backend
// (supports(op, dtype, device)); the registry only says what exists and who
// may serve a job.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "torus/comm/backends.h"
#include "torus/comm/context.h"

namespace torus::comm {

enum class BackendRole : uint8_t {
  kHost,    // host memory: a candidate for the world's host backend (TORUS_BACKEND names one)
  kDevice,  // the device backend of its memory's device type, made by the bootstrap when usable
  kNamed,   // made only when asked for by name (create_world_backend)
};

// Whether a backend can serve a job, and in a few words why (or why not):
// "libfabric provider shm", "not launched by mpirun".
struct Usability {
  bool usable = true;
  std::string detail;
};

struct BackendFactory {
  std::string name;
  BackendRole role = BackendRole::kNamed;
  DeviceType memory = DeviceType::kCPU;  // where the buffers of its ops live
  // Among the host backends that can serve a job, the default is the one of
  // the highest preference (choose_host_backend).
  int preference = 0;
  // Whether it can serve the job `init` describes. Local and cheap: no
  // communication, so that it may run on one rank for all. Null: always.
  std::function<Usability(const BackendInit&)> usability;
  // The world communicator (collective over the job). Throws like the backend.
  std::function<BackendPtr(const BackendInit&)> create;
};

// A launcher's runtime that hands a value from rank 0 to every rank before
// the store exists (mpirun's: Note [MPI lifetime in the bootstrap] in
// src/comm/mpi/mpi_bootstrap.h).
struct LauncherChannel {
  // Keeps the runtime up while the handle lives.
  std::function<std::shared_ptr<void>()> hold;
  // Collective: rank 0's `value_on_root` on every rank, within `timeout`.
  std::function<std::string(const std::string& value_on_root, Duration timeout)> broadcast;
};

class BackendRegistry {
 public:
  // Throw InvalidArgument on a duplicate name or an entry without a factory.
  void add(BackendFactory factory);
  void add_channel(std::string launcher, LauncherChannel channel);

  const BackendFactory* find(std::string_view name) const;
  const LauncherChannel* channel(std::string_view launcher) const;
  const std::vector<BackendFactory>& factories() const { return factories_; }

 private:
  std::vector<BackendFactory> factories_;
  std::vector<std::pair<std::string, LauncherChannel>> channels_;
};

// Generated (src/CMakeLists.txt): declares and calls register_<name>_backend
// for every backend of this build.
void register_built_backends(BackendRegistry& registry);

// This library's registry, filled on first use; never changes afterwards.
const BackendRegistry& backend_registry();

// The channel of `launcher` ("mpi"), or nullptr when this build has none.
const LauncherChannel* launcher_channel(std::string_view launcher);

// The default host backend for the job `init` describes: the host backend of
// the highest preference that can serve it (ofi when libfabric offers a
// provider for the job's hosts, else mpi under mpirun). `why` says so, for
// the bootstrap's log line. Throws Unsupported when none can, naming each
// one's reason.
struct HostBackendChoice {
  std::string name;
  std::string why;
};
HostBackendChoice choose_host_backend(const BackendInit& init);

// The same decided once for the job: rank 0 chooses and publishes its choice
// through init.store; the other ranks read it (within `timeout`), so that
// every rank makes the same backend even if their probes differ. When rank 0
// cannot choose, every rank throws (rank 0 its own error, the others
// Unsupported quoting it).
HostBackendChoice agree_host_backend(const BackendInit& init, Duration timeout);

}  // namespace torus::comm
