// The fake runtime's host-driven collectives (nrt_cc_global_comm_init,
// nrta_cc_prepare, nrta_cc_schedule, nrta_is_completed), run over MPI
// between the test's ranks by one progress thread per process, in schedule
// order — as the runtime's collectives queue does. 16-bit floats are reduced
// in f32 and rounded once.
//
// Faults (TORUS_TEST_FAKE_NRT_*), keyed on an op's input size in bytes so
// that a test triggers them with one deliberately sized op:
//   HANG_BYTES=n           every rank: an op with n input bytes never completes
//   DEAD_RANK=r, DEAD_BYTES=n  rank r's device "dies" at an op of n input
//                          bytes: its op completes with NRT_HW_ERROR, and the
//                          op never completes on the other ranks (their peer
//                          is gone)
// A faulted op is skipped without touching MPI, so later ops still run.
#include <mpi.h>

#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <thread>

#include "fake_nrt.h"

using torus::device::neuron::NRT_CC_ALLGATHER;
using torus::device::neuron::NRT_CC_ALLREDUCE;
using torus::device::neuron::NRT_CC_REDUCESCATTER;
using torus::device::neuron::NRT_HW_ERROR;
using torus::device::neuron::nrt_cc_comm_t;
using torus::device::neuron::nrt_tensor_list_t;
using torus::device::neuron::nrta_seq_t;
namespace nrt = torus::device::neuron;

struct nrt_cc_context {
  std::vector<int> group;  // global ranks
  int dtype = 0, op = 0, cc_op = 0;
  nrt_tensor* in = nullptr;
  nrt_tensor* out = nullptr;
  NRT_STATUS* result = nullptr;
  nrta_seq_t seq = 0;
};

namespace {

long long env_num(const char* name, long long def) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::atoll(v) : def;
}

struct Cc {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<nrt_cc_context*> queue;
  std::map<nrta_seq_t, bool> completed;
  nrta_seq_t next_seq = 1;
  bool inited = false;
  bool we_initialised_mpi = false;
  bool stop = false;
  int rank = 0, size = 1;
  std::thread thread;
  std::map<std::vector<int>, MPI_Comm> comms;
  long long hang_bytes = env_num("TORUS_TEST_FAKE_NRT_HANG_BYTES", -1);
  long long dead_rank = env_num("TORUS_TEST_FAKE_NRT_DEAD_RANK", -1);
  long long dead_bytes = env_num("TORUS_TEST_FAKE_NRT_DEAD_BYTES", -1);

  void shutdown() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
    if (we_initialised_mpi) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  MPI_Comm comm_for(const std::vector<int>& group) {
    auto it = comms.find(group);
    if (it != comms.end()) return it->second;
    MPI_Group world_group, g;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &g);
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Comm_create_group(MPI_COMM_WORLD, g, 0, &c);
    MPI_Group_free(&g);
    MPI_Group_free(&world_group);
    comms.emplace(group, c);
    return c;
  }

  static size_t elt(int dtype) {
    switch (dtype) {
      case nrt::NRT_DTYPE_FLOAT32: case nrt::NRT_DTYPE_INT32: return 4;
      case nrt::NRT_DTYPE_FLOAT16: case nrt::NRT_DTYPE_BFLOAT16: return 2;
      case nrt::NRT_DTYPE_INT64: return 8;
      default: return 1;
    }
  }

  static float half_to_float(uint16_t h, bool bf16) {
    if (bf16) return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
    uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
              : exp == 31 ? (man ? NAN : INFINITY)
                          : std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
    return sign ? -v : v;
  }
  static uint16_t float_to_half(float f, bool bf16) {
    if (bf16) {
      uint32_t u = std::bit_cast<uint32_t>(f);
      u += 0x7fffu + ((u >> 16) & 1u);
      return static_cast<uint16_t>(u >> 16);
    }
    // Values in these tests are small integers (exact in f16), or an
    // overflow's infinity.
    uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (std::isnan(f)) return 0x7e00;
    if (std::isinf(f)) return static_cast<uint16_t>(sign | 0x7c00);
    f = std::fabs(f);
    if (f == 0) return sign;
    int e = 0;
    float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
    int exp = e + 14;
    if (exp <= 0) return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::lrint(std::ldexp(f, 24))));
    uint32_t man = static_cast<uint32_t>(std::lrint((m * 2 - 1) * 1024));
    if (man == 1024) { man = 0; ++exp; }
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
    return static_cast<uint16_t>(sign | (exp << 10) | man);
  }

  void run_one(nrt_cc_context* c) {
    const size_t in_bytes = fake::tensor_size(c->in);
    const size_t out_bytes = fake::tensor_size(c->out);
    // Faults.
    if (hang_bytes >= 0 && static_cast<long long>(in_bytes) == hang_bytes) return;  // never completes
    if (dead_bytes >= 0 && static_cast<long long>(in_bytes) == dead_bytes) {
      if (rank == dead_rank) finish(c, NRT_HW_ERROR);
      return;  // the survivors wait forever for their dead peer
    }
    MPI_Comm comm = comm_for(c->group);
    unsigned char* in = fake::tensor_data(c->in);
    unsigned char* out = fake::tensor_data(c->out);
    const bool half = c->dtype == nrt::NRT_DTYPE_FLOAT16 || c->dtype == nrt::NRT_DTYPE_BFLOAT16;
    const bool bf16 = c->dtype == nrt::NRT_DTYPE_BFLOAT16;
    const size_t e = elt(c->dtype);
    if (c->cc_op == NRT_CC_ALLGATHER) {
      std::vector<unsigned char> tmp(out_bytes);
      MPI_Allgather(in, static_cast<int>(in_bytes), MPI_BYTE, tmp.data(), static_cast<int>(in_bytes), MPI_BYTE, comm);
      std::memcpy(out, tmp.data(), out_bytes);
      finish(c, NRT_SUCCESS);
      return;
    }
    MPI_Op op = c->op == nrt::NRT_OP_MAX ? MPI_MAX : c->op == nrt::NRT_OP_MIN ? MPI_MIN : MPI_SUM;
    MPI_Datatype t = c->dtype == nrt::NRT_DTYPE_FLOAT32 ? MPI_FLOAT
                     : c->dtype == nrt::NRT_DTYPE_INT32 ? MPI_INT32_T
                     : c->dtype == nrt::NRT_DTYPE_INT64 ? MPI_INT64_T
                     : c->dtype == nrt::NRT_DTYPE_UINT8 ? MPI_UINT8_T
                                                        : MPI_FLOAT;  // 16-bit floats: staged in f32
    const size_t count_in = in_bytes / e;
    const size_t count_out = out_bytes / e;
    std::vector<unsigned char> sbuf, rbuf;
    if (half) {
      sbuf.resize(count_in * 4);
      rbuf.resize(count_out * 4);
      for (size_t i = 0; i < count_in; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        float f = half_to_float(h, bf16);
        std::memcpy(sbuf.data() + 4 * i, &f, 4);
      }
    } else {
      sbuf.assign(in, in + in_bytes);
      rbuf.resize(out_bytes);
    }
    if (c->cc_op == NRT_CC_ALLREDUCE) {
      MPI_Allreduce(sbuf.data(), rbuf.data(), static_cast<int>(count_in), t, op, comm);
    } else {
      MPI_Reduce_scatter_block(sbuf.data(), rbuf.data(), static_cast<int>(count_out), t, op, comm);
    }
    if (half) {
      for (size_t i = 0; i < count_out; ++i) {
        float f;
        std::memcpy(&f, rbuf.data() + 4 * i, 4);
        uint16_t h = float_to_half(f, bf16);
        std::memcpy(out + 2 * i, &h, 2);
      }
    } else {
      std::memcpy(out, rbuf.data(), out_bytes);
    }
    finish(c, NRT_SUCCESS);
  }

  void finish(nrt_cc_context* c, NRT_STATUS s) {
    *c->result = s;
    std::lock_guard<std::mutex> lock(mu);
    completed[c->seq] = true;
  }

  void loop() {
    for (;;) {
      nrt_cc_context* c = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop with nothing left
        c = queue.front();
        queue.pop_front();
      }
      run_one(c);
      delete c;
    }
  }
};

Cc& cc() {
  static Cc& c = *new Cc;  // never destroyed (fake_nrt.cpp): nrt_close stops its thread
  return c;
}

}  // namespace

namespace fake {
void shutdown_collectives() { cc().shutdown(); }
}  // namespace fake

extern "C" {

NRT_STATUS nrt_cc_global_comm_init(uint32_t vnc, uint32_t global_id, uint32_t global_count) {
  fake::trace("nrt_cc_global_comm_init");
  if (!fake::state().initialised) return NRT_UNINITIALIZED;
  Cc& c = cc();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.inited) return NRT_SUCCESS;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    c.we_initialised_mpi = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  if (static_cast<int>(global_id) != c.rank || static_cast<int>(global_count) != c.size) return NRT_INVALID;
  if (static_cast<int>(vnc) >= static_cast<int>(fake::state().visible.size())) return NRT_INVALID;
  c.inited = true;
  c.thread = std::thread([&c] { c.loop(); });
  return NRT_SUCCESS;
}

NRT_STATUS nrta_cc_prepare(nrt_cc_comm_t* comm, nrt_tensor_list_t* inputs, nrt_tensor_list_t* outputs, int dtype,
                           int op, int cc_op, nrt_cc_context** ctx) {
  fake::trace("nrta_cc_prepare");
  if (!cc().inited) return NRT_UNINITIALIZED;
  if (comm == nullptr || inputs == nullptr || outputs == nullptr || ctx == nullptr) return NRT_INVALID;
  if (inputs->num_tensors != 1 || outputs->num_tensors != 1) return NRT_INVALID;
  if (comm->rank >= comm->rank_n || comm->replica_group == nullptr) return NRT_INVALID;
  if (cc_op != NRT_CC_ALLGATHER && cc_op != NRT_CC_ALLREDUCE && cc_op != NRT_CC_REDUCESCATTER) return NRT_INVALID;
  auto* c = new nrt_cc_context;
  c->group.assign(comm->replica_group, comm->replica_group + comm->rank_n);
  c->dtype = dtype;
  c->op = op;
  c->cc_op = cc_op;
  c->in = reinterpret_cast<nrt_tensor*>(inputs->tensors[0]);
  c->out = reinterpret_cast<nrt_tensor*>(outputs->tensors[0]);
  // Sizes must agree with the op, as the runtime checks them.
  size_t in_b = fake::tensor_size(c->in), out_b = fake::tensor_size(c->out);
  size_t n = comm->rank_n;
  bool ok = cc_op == NRT_CC_ALLREDUCE ? in_b == out_b : cc_op == NRT_CC_ALLGATHER ? out_b == in_b * n : in_b == out_b * n;
  if (!ok) {
    delete c;
    return NRT_INVALID;
  }
  *ctx = c;
  return NRT_SUCCESS;
}

NRT_STATUS nrta_cc_schedule(nrt_cc_context** ctx, int queue, NRT_STATUS* result, nrta_seq_t* seq) {
  fake::trace("nrta_cc_schedule");
  if (ctx == nullptr || *ctx == nullptr || result == nullptr || seq == nullptr || queue != 0) return NRT_INVALID;
  Cc& c = cc();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    (*ctx)->result = result;
    (*ctx)->seq = c.next_seq++;
    *seq = (*ctx)->seq;
    c.completed[*seq] = false;
    c.queue.push_back(*ctx);
  }
  *ctx = nullptr;  // owned by the queue now
  c.cv.notify_all();
  return NRT_SUCCESS;
}

NRT_STATUS nrta_is_completed(nrta_seq_t seq, bool* completed) {
  fake::trace("nrta_is_completed");
  if (completed == nullptr) return NRT_INVALID;
  Cc& c = cc();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.completed.find(seq);
  if (it == c.completed.end()) return NRT_INVALID;
  *completed = it->second;
  return NRT_SUCCESS;
}

}  // extern "C"
