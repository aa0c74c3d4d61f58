// Private: what the bootstrap (src/comm/context.cpp) may use of MPI when a job
// is launched by Open MPI: handing rank 0's store address and job token to
// every rank before the store exists.
//
// Note [MPI lifetime in the bootstrap]: MPI can be initialised only once per
// process, and Torus finalizes it when the last holder of its runtime goes
// away (mpi_runtime.h). mpi_bootstrap_broadcast() holds the runtime only
// during the call, so a bootstrap that goes on to create the mpi backend, or
// that wants MPI_Finalize to run only at the end of the job, must keep a
// mpi_runtime_hold() handle from before the broadcast until the Context is
// destroyed. Otherwise MPI is finalized when the broadcast returns, and a
// later mpi backend fails with CommError.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace torus::comm {

// True when this process was started by Open MPI's mpirun (OMPI_COMM_WORLD_SIZE
// is set). Reads the environment only; never starts MPI. Thread safe.
bool mpi_launched();

// Collective over MPI_COMM_WORLD: returns rank 0's `value_on_root` on every
// rank (other ranks' argument is ignored). Starts the MPI runtime if needed
// (MPI_Init_thread). Runs on a private duplicate of MPI_COMM_WORLD, so it
// never mixes with the application's own use of MPI_COMM_WORLD. Blocks until
// every rank has called it; throws TimeoutError if that takes longer than
// `timeout`, CommError if MPI fails, InvalidArgument if the value is larger
// than 64 MiB. Thread safe.
std::string mpi_bootstrap_broadcast(const std::string& value_on_root,
                                    std::chrono::milliseconds timeout = std::chrono::minutes(10));

// Keeps MPI initialised while the returned handle lives (Note [MPI lifetime in
// the bootstrap]); starts the runtime if needed. Throws like
// MpiRuntime::acquire(). Thread safe.
std::shared_ptr<void> mpi_runtime_hold();

}  // namespace torus::comm
