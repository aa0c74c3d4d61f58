// NcclComm (nccl_comm.h) and the NCCL error helpers (nccl_check.h).
#include "comm/nccl/nccl_comm.h"

#include <algorithm>
#include <thread>

#include "comm/nccl/nccl_check.h"
#include "core/log.h"
#include "device/cuda/cuda_device.h"

namespace torus::comm::nccl {

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string text = ncclGetErrorString(result);
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  return text;
}

void throw_nccl_error(ncclResult_t result, const char* expr, ncclComm_t comm, const char* file, int line) {
  std::string msg = fmt::format("NCCL error: {} failed: {} at {}:{}", expr, nccl_error_text(result, comm), file, line);
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) throw InvalidArgument(msg);
  throw CommError(msg);
}

namespace {

ncclConfig_t nonblocking_config(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();
  return config;
}

// Poll pacing: fast at first (ops usually become ready within microseconds),
// then at most every millisecond.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{10};
};

}  // namespace

std::unique_ptr<NcclComm> NcclComm::init(const ncclUniqueId& id, int nranks, int rank, int device,
                                         const std::string& name, Clock::time_point deadline) {
  std::unique_ptr<NcclComm> c(new NcclComm(device, rank, nranks, name));
  device::cuda::DeviceGuard guard(device);
  ncclConfig_t config = nonblocking_config(c->name_);
  ncclResult_t r = ncclCommInitRankConfig(&c->comm_, nranks, id, rank, &config);
  if (!nccl_ok_or_in_progress(r)) {
    std::string text = nccl_error_text(r, c->comm_);
    if (c->comm_ != nullptr) c->abort();
    throw CommError(fmt::format("NCCL communicator '{}' (rank {} of {}, CUDA device {}): ncclCommInitRankConfig "
                                "failed: {}",
                                name, rank, nranks, device, text));
  }
  c->wait_or_throw(deadline, "initialisation");
  return c;
}

std::unique_ptr<NcclComm> NcclComm::split(int color, int key, const std::string& name, Clock::time_point deadline) {
  std::unique_ptr<NcclComm> child(new NcclComm(device_, -1, 0, name));
  device::cuda::DeviceGuard guard(device_);
  ncclConfig_t config = nonblocking_config(child->name_);
  ncclComm_t made = nullptr;
  ncclResult_t r = call([&](ncclComm_t c) {
    return ncclCommSplit(c, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &made, &config);
  });
  child->comm_ = made;  // owned from here on, even if the split fails below
  if (!nccl_ok_or_in_progress(r)) {
    if (made != nullptr) child->abort();
    throw CommError(fmt::format("NCCL communicator '{}': ncclCommSplit(color {}, key {}) failed: {}", name_, color,
                                key, nccl_error_text(r, comm_)));
  }
  try {
    wait_or_throw(deadline, "split");
  } catch (...) {
    if (made != nullptr) child->abort();
    throw;
  }
  if (color < 0) return nullptr;
  TORUS_CHECK(made != nullptr, CommError, "NCCL communicator '{}': ncclCommSplit returned no communicator", name_);
  child->wait_or_throw(deadline, "initialisation after split");
  TORUS_CHECK_NCCL(ncclCommUserRank(made, &child->rank_), made);
  TORUS_CHECK_NCCL(ncclCommCount(made, &child->size_), made);
  return child;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr || aborted()) return;  // an aborted handle is never touched again
  try {
    device::cuda::DeviceGuard guard(device_);
    ncclResult_t r = call([](ncclComm_t c) { return ncclCommFinalize(c); });
    if (nccl_ok_or_in_progress(r) && wait_ready(Clock::now() + shutdown_timeout_).status == Status::kReady) {
      std::lock_guard<std::mutex> lock(call_mu_);
      ncclResult_t d = ncclCommDestroy(comm_);
      if (d != ncclSuccess) TORUS_LOG_WARN("nccl: destroying communicator '{}' failed: {}", name_, ncclGetErrorString(d));
      aborted_ = true;  // the handle is gone
      return;
    }
    TORUS_LOG_WARN("nccl: communicator '{}' did not finalise within {} ms; aborting it", name_,
                   shutdown_timeout_.count());
  } catch (const std::exception& e) {
    TORUS_LOG_WARN("nccl: finalising communicator '{}' failed ({}); aborting it", name_, e.what());
  }
  abort();
}

void NcclComm::throw_if_aborted() const {
  if (aborted_ || abort_requested_.load()) {
    throw CommError(fmt::format("NCCL communicator '{}' was aborted", name_));
  }
}

NcclComm::Readiness NcclComm::wait_ready(Clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      if (aborted_ || abort_requested_.load()) return {Status::kAborted, ""};
      r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return {Status::kError, nccl_error_text(r, comm_)};
      if (state != ncclSuccess && state != ncclInProgress) return {Status::kError, nccl_error_text(state, comm_)};
    }
    if (state == ncclSuccess) return {Status::kReady, ""};
    if (Clock::now() >= deadline) return {Status::kTimeout, ""};
    backoff.pause();
  }
}

void NcclComm::wait_or_throw(Clock::time_point deadline, const char* what) {
  Readiness ready = wait_ready(deadline);
  if (ready.status == Status::kReady) return;
  std::string where = fmt::format("NCCL communicator '{}' (rank {} of {}, CUDA device {})", name_, rank_, size_,
                                  device_);
  abort();
  switch (ready.status) {
    case Status::kTimeout:
      throw TimeoutError(fmt::format("{}: {} did not complete before the deadline; the communicator was aborted. "
                                     "Usually some ranks did not reach this point (they failed earlier, or call "
                                     "collectives in a different order) or hosts cannot reach each other",
                                     where, what));
    case Status::kAborted: throw CommError(fmt::format("{}: {} was interrupted by an abort", where, what));
    default: throw CommError(fmt::format("{}: {} failed: {}", where, what, ready.error));
  }
}

std::string NcclComm::async_error() {
  std::lock_guard<std::mutex> lock(call_mu_);
  if (aborted_ || comm_ == nullptr) return "";
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return nccl_error_text(r, comm_);
  if (state == ncclSuccess || state == ncclInProgress) return "";
  return nccl_error_text(state, comm_);
}

void NcclComm::abort() {
  abort_requested_.store(true);
  std::lock_guard<std::mutex> lock(call_mu_);
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  auto start = Clock::now();
  try {
    device::cuda::DeviceGuard guard(device_);
    ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess) TORUS_LOG_WARN("nccl: ncclCommAbort on '{}' returned {}", name_, ncclGetErrorString(r));
  } catch (const std::exception& e) {
    TORUS_LOG_WARN("nccl: aborting communicator '{}' failed: {}", name_, e.what());
  }
  TORUS_LOG_WARN("nccl: aborted communicator '{}' (rank {} of {}) in {} ms", name_, rank_, size_,
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

}  // namespace torus::comm::nccl
