// Bootstrap helpers over the MPI runtime (contracts in mpi_bootstrap.h).
#include "comm/mpi/mpi_bootstrap.h"

#include <cstdint>
#include <numeric>

#include "comm/mpi/mpi_check.h"
#include "comm/mpi/mpi_runtime.h"
#include "core/log.h"
#include "torus/core/params.h"

namespace torus::comm {

namespace {
constexpr uint64_t kMaxBootstrapBytes = uint64_t{64} << 20;
}  // namespace

bool mpi_launched() {
  return env_lookup("OMPI_COMM_WORLD_SIZE").has_value();  // a launcher variable (Note [One reader of the environment])
}

std::shared_ptr<void> mpi_runtime_hold() {
  return mpi::MpiRuntime::acquire();
}

std::string mpi_bootstrap_broadcast(const std::string& value_on_root, std::chrono::milliseconds timeout) {
  auto runtime = mpi::MpiRuntime::acquire();
  const int rank = runtime->world_rank(), size = runtime->world_size();
  if (rank == 0) {
    TORUS_CHECK(value_on_root.size() <= kMaxBootstrapBytes, InvalidArgument,
                "mpi bootstrap: {} bytes to broadcast exceed the limit of {}", value_on_root.size(),
                kMaxBootstrapBytes);
  }
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto world = std::make_shared<mpi::MpiComm>(MPI_COMM_WORLD, GroupInfo{"MPI_COMM_WORLD", rank, size, ranks},
                                              /*owned=*/false);
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  runtime->run_blocking(
      world, fmt::format("bootstrap: MPI_Comm_idup of MPI_COMM_WORLD (rank {}/{})", rank, size), timeout,
      [dup](MPI_Request* req) { return MPI_Comm_idup(MPI_COMM_WORLD, dup.get(), req); },
      [dup](const MPI_Status&) { TORUS_CHECK_MPI(MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN)); });
  auto comm = std::make_shared<mpi::MpiComm>(*dup, GroupInfo{"bootstrap", rank, size, ranks}, /*owned=*/true);

  auto length = std::make_shared<uint64_t>(rank == 0 ? value_on_root.size() : 0);
  runtime->run_blocking(
      comm, fmt::format("bootstrap: broadcast of the value's length (rank {}/{})", rank, size), timeout,
      [length, c = *dup](MPI_Request* req) { return MPI_Ibcast(length.get(), 1, MPI_UINT64_T, 0, c, req); });
  TORUS_CHECK(*length <= kMaxBootstrapBytes, CommError, "mpi bootstrap: rank 0 announced {} bytes (limit {})", *length,
              kMaxBootstrapBytes);
  auto value = std::make_shared<std::string>(rank == 0 ? value_on_root : std::string(*length, '\0'));
  runtime->run_blocking(comm, fmt::format("bootstrap: broadcast of {} bytes (rank {}/{})", *length, rank, size),
                        timeout, [value, c = *dup](MPI_Request* req) {
                          return MPI_Ibcast(value->data(), static_cast<int>(value->size()), MPI_CHAR, 0, c, req);
                        });
  runtime->release_comm(std::move(comm));
  return *value;
}

}  // namespace torus::comm
