// The conformance suite's world backend (a gtest Environment set up once per
// process) and shared helpers. See backend_fixture.h.
#include "backend_fixture.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "comm/backend_registry.h"
#include "torus/comm/context.h"
#include "torus/comm/store.h"
#include "torus/core/error.h"
#include "torus/core/logging.h"

namespace torus::comm::test {

namespace {

std::optional<long long> env_int(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  return std::atoll(s);
}

LaunchInfo launch_from_env() {
  LaunchInfo l;
  l.rank = static_cast<int>(env_int("OMPI_COMM_WORLD_RANK").value_or(0));
  l.world_size = static_cast<int>(env_int("OMPI_COMM_WORLD_SIZE").value_or(1));
  l.local_rank = static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(l.rank));
  l.local_size = static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(l.world_size));
  l.source = std::getenv("OMPI_COMM_WORLD_SIZE") ? "open-mpi" : "single";
  l.launched_by_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  return l;
}

class BackendEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    const char* name = std::getenv("TORUS_TEST_BACKEND");
    name_ = name && *name ? name : "mpi";
    timeout_ = Duration(env_int("TORUS_TEST_TIMEOUT_MS").value_or(60000));
    fault_timeout_ = Duration(env_int("TORUS_TEST_FAULT_TIMEOUT_MS").value_or(2000));
    fault_margin_ = Duration(env_int("TORUS_TEST_FAULT_MARGIN_MS").value_or(4000));
    launch_ = launch_from_env();
    set_log_rank(launch_.rank, launch_.world_size);
    hosts_.host_of_rank.assign(static_cast<size_t>(launch_.world_size), 0);  // one host: the suite runs locally
    hosts_.hostnames = {"localhost"};
    BackendInit init;
    init.launch = &launch_;
    init.hosts = &hosts_;
    init.timeout = timeout_;
    try {
      if (name_ != "mpi") init.store = make_store();
      world_ = create_world_backend(name_, init);
    } catch (const std::exception& e) {
      FAIL() << "creating the '" << name_ << "' world backend failed: " << e.what();
    }
  }

  void TearDown() override {
    if (world_) {
      // Leave together, so that no rank tears its transport down while a peer
      // still talks to it.
      try {
        world_->barrier(timeout_)->wait();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "final barrier: " << e.what();
      }
    }
    world_.reset();
    store_server_.reset();
    runtime_hold_.reset();
  }

  // --- Hook: the Store for backends that rendezvous through one (ofi) -------
  // Rank 0 hosts a TcpStoreServer on loopback with a fresh job token; port
  // and token reach the other ranks through MPI (the registry's "mpi"
  // launcher channel) when MPI is built in, else from TORUS_TEST_STORE_PORT
  // and TORUS_TEST_STORE_TOKEN (rank 0 then listens on that port).
  std::shared_ptr<Store> make_store() {
    std::string host = "127.0.0.1";
    int port = 0;
    std::string token;
    if (const LauncherChannel* mpi = launcher_channel("mpi")) {
      runtime_hold_ = mpi->hold();  // MPI stays up until TearDown
      if (launch_.rank == 0) {
        token = generate_job_token();
        store_server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{host, 0, token});
        port = store_server_->port();
      }
      std::string shared = mpi->broadcast(std::to_string(port) + " " + token, timeout_);
      port = std::stoi(shared.substr(0, shared.find(' ')));
      token = shared.substr(shared.find(' ') + 1);
      return connect_store(host, port, token);
    }
    port = static_cast<int>(env_int("TORUS_TEST_STORE_PORT").value_or(0));
    const char* t = std::getenv("TORUS_TEST_STORE_TOKEN");
    token = t ? t : "";
    if (port == 0 || token.empty()) {
      throw InvalidArgument("backend tests without MPI need TORUS_TEST_STORE_PORT and TORUS_TEST_STORE_TOKEN");
    }
    if (launch_.rank == 0) {
      store_server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{host, port, token});
    }
    return connect_store(host, port, token);
  }

  std::shared_ptr<Store> connect_store(const std::string& host, int port, const std::string& token) const {
    TcpStore::Options options;
    options.host = host;
    options.port = port;
    options.token = token;
    options.connect_timeout = timeout_;
    return std::make_shared<TcpStore>(options);
  }

  std::string name_;
  Duration timeout_{0}, fault_timeout_{0}, fault_margin_{0};
  LaunchInfo launch_;
  HostMap hosts_;
  BackendPtr world_;
  std::shared_ptr<void> runtime_hold_;
  std::unique_ptr<TcpStoreServer> store_server_;
};

// gtest owns the environment.
BackendEnvironment* const g_env =
    static_cast<BackendEnvironment*>(testing::AddGlobalTestEnvironment(new BackendEnvironment));

// Exact conversions for the reference side, independent of kernels/cpu.
uint16_t to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

}  // namespace

Backend& world() {
  return *world_ptr();
}
BackendPtr world_ptr() {
  if (!g_env->world_) throw Error("the backend under test was not created (see the environment's SetUp failure)");
  return g_env->world_;
}
const std::string& backend_name() {
  return g_env->name_;
}
Duration op_timeout() {
  return g_env->timeout_;
}
Duration fault_timeout() {
  return g_env->fault_timeout_;
}
Duration fault_margin() {
  return g_env->fault_margin_;
}

// ---------------------------------------------------------------------------
// Buf

Buf::Buf(DType t, size_t n, double fill) : dtype_(t), n_(n), words_((n * dtype_size(t) + 7) / 8) {
  for (size_t i = 0; i < n; ++i) set(i, fill);
}

void Buf::set(size_t i, double v) {
  char* p = at(i);
  switch (dtype_) {
    case DType::kF32:
      *reinterpret_cast<float*>(p) = static_cast<float>(v);
      break;
    case DType::kF64:
      *reinterpret_cast<double*>(p) = v;
      break;
    case DType::kF16:
      *reinterpret_cast<_Float16*>(p) = static_cast<_Float16>(v);
      break;
    case DType::kBF16:
      *reinterpret_cast<uint16_t*>(p) = to_bf16(static_cast<float>(v));
      break;
    case DType::kI32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v);
      break;
    case DType::kI64:
      *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case DType::kU8:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
  }
}

double Buf::get(size_t i) const {
  const char* p = reinterpret_cast<const char*>(words_.data()) + i * dtype_size(dtype_);
  switch (dtype_) {
    case DType::kF32:
      return *reinterpret_cast<const float*>(p);
    case DType::kF64:
      return *reinterpret_cast<const double*>(p);
    case DType::kF16:
      return static_cast<double>(*reinterpret_cast<const _Float16*>(p));
    case DType::kBF16:
      return from_bf16(*reinterpret_cast<const uint16_t*>(p));
    case DType::kI32:
      return *reinterpret_cast<const int32_t*>(p);
    case DType::kI64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case DType::kU8:
      return *reinterpret_cast<const uint8_t*>(p);
  }
  return NAN;
}

// ---------------------------------------------------------------------------
// Values and expectations

double value(int rank, size_t i) {
  return static_cast<double>((i * 7 + static_cast<size_t>(rank) * 3) % 13 + 1);
}
double prod_value(int rank, size_t i) {
  return static_cast<double>(1 + (i + static_cast<size_t>(rank)) % 2);
}
double input(ReduceOp op, int rank, size_t i) {
  return op == ReduceOp::kProd ? prod_value(rank, i) : value(rank, i);
}

double expected_reduce(ReduceOp op, DType t, int n, size_t i) {
  double acc = input(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = input(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
    }
  }
  if (op == ReduceOp::kAvg) return dtype_is_floating(t) ? acc / n : std::trunc(acc / n);
  return acc;
}

double tolerance(DType t, ReduceOp op, double expected) {
  if (op != ReduceOp::kAvg || !dtype_is_floating(t)) return 0;
  double rel = 0;
  switch (t) {
    case DType::kF64:
      rel = 0x1p-50;
      break;
    case DType::kF32:
      rel = 0x1p-22;
      break;
    case DType::kF16:
      rel = 0x1p-9;
      break;
    case DType::kBF16:
      rel = 0x1p-6;
      break;
    default:
      break;
  }
  return std::abs(expected) * rel;
}

void expect_values(const Buf& buf, size_t offset, size_t n, const std::function<double(size_t)>& want,
                   const std::string& what, const std::function<double(size_t)>& tol) {
  size_t bad = 0, first = 0;
  double first_got = 0, first_want = 0;
  for (size_t i = 0; i < n; ++i) {
    double w = want(i), g = buf.get(offset + i);
    double allowed = tol ? tol(i) : 0;
    if (!(std::abs(g - w) <= allowed)) {
      if (bad++ == 0) {
        first = i;
        first_got = g;
        first_want = w;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements wrong; first at " << first << ": got "
                     << first_got << ", want " << first_want;
}

void wait_ok(const WorkPtr& work, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
}

std::string expect_comm_error(const std::function<WorkPtr()>& fn, const std::string& what) {
  try {
    WorkPtr w = fn();
    w->wait(op_timeout());
    ADD_FAILURE() << what << ": expected CommError, the op succeeded";
  } catch (const CommError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": expected CommError, got: " << e.what();
  }
  return {};
}

std::string case_name(DType t, size_t count, bool in_place, const std::string& extra) {
  return std::string(dtype_name(t)) + " " + extra + " count " + std::to_string(count) +
         (in_place ? " in-place" : " out-of-place");
}

std::string DTypeName::operator()(const testing::TestParamInfo<DType>& info) const {
  return std::string(dtype_name(info.param));
}

}  // namespace torus::comm::test
