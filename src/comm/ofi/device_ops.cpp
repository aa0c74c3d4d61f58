// The ofi backend's ops on device buffers (a world made as "ofi-neuron").
//
// Note [Device buffers]: the host can neither read nor write Neuron device
// memory (nor, in general, an accelerator's), while every collective of this
// backend reduces on the host and moves same-host data through the host
// segment. So a collective on device buffers copies its input into host
// scratch (Device::copy: synchronous for Neuron), runs the host collective
// there, and copies its output back: two copies, the algorithm unchanged.
//
// Point to point needs no host work, so when the world's provider can
// register the device's memory (FI_HMEM, checked once at world creation by
// a probe registration, ofi_backend.cpp) send and recv hand the device
// buffer itself to the provider, at the address its driver knows
// (Device::nic_address; nrt_tensor_get_va for Neuron) and registered as that
// device's memory (FI_HMEM_NEURON): EFA then reads and writes device memory
// directly, with no copy. Otherwise they go through host scratch too.
//
// The copies run in the engine's thread, inside the op: a copy of a large
// buffer holds up the progress of the world's other ops meanwhile (the
// Neuron runtime's tensor copies are synchronous, so there is nothing to
// overlap with here anyway). Staging buffers above 16 MiB are freed when
// their op ends (OpCtx::staging), not kept in the engine's pool.
//
// Registration: each zero-copy send or recv registers its device range for
// the op's life (no registration cache yet), and the device number given
// to libfabric is the runtime's NeuronCore index (Device::nic_address):
// whether efa's FI_HMEM_NEURON wants the core or the chip's device number
// is for a trn1/trn2 host to show.
#include "comm/ofi/ofi_group.h"
#include "core/log.h"
#include "torus/core/error.h"
#include "torus/device/device.h"

namespace torus::comm::ofi {
namespace {

// A failed copy (the runtime's error) fails the op with CommError naming it;
// the engine then breaks the group and tells the peers (Engine::fail).
void device_copy(OpCtx& c, device::Device* dev, void* dst, const void* src, size_t bytes, const char* what) {
  try {
    dev->copy(dst, src, bytes);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} failed: copying {} bytes {}: {}", c.info().describe(), bytes, what, e.what()));
  }
}

constexpr const char* kIn = "of its input from device memory";
constexpr const char* kOut = "of its result to device memory";

}  // namespace

Task device_all_reduce(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                       DType dt, ReduceOp op, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  char* h = c.staging(bytes);
  device_copy(c, dev, h, in, bytes, kIn);
  co_await group_all_reduce(c, t, h, h, count, dt, op, seq);
  device_copy(c, dev, out, h, bytes, kOut);
}

Task device_reduce_scatter(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                           DType dt, ReduceOp op, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  char* hin = c.staging(bytes * static_cast<size_t>(t->size));
  char* hout = c.staging(bytes);
  device_copy(c, dev, hin, in, bytes * static_cast<size_t>(t->size), kIn);
  co_await group_reduce_scatter(c, t, hin, hout, count, dt, op, seq);
  device_copy(c, dev, out, hout, bytes, kOut);
}

Task device_all_gather(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                       DType dt, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  char* hout = c.staging(bytes * static_cast<size_t>(t->size));
  char* hin = hout + bytes * static_cast<size_t>(t->rank);  // in place: the contract's in == out + rank * count
  device_copy(c, dev, hin, in, bytes, kIn);
  co_await group_all_gather(c, t, hin, hout, count, dt, seq);
  device_copy(c, dev, out, hout, bytes * static_cast<size_t>(t->size), kOut);
}

Task device_broadcast(OpCtx& c, Topology* t, device::Device* dev, void* buf, size_t count, DType dt, int root,
                      uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  char* h = c.staging(bytes);
  if (t->rank == root) device_copy(c, dev, h, buf, bytes, kIn);
  co_await group_broadcast(c, t, h, count, dt, root, seq);
  if (t->rank != root) device_copy(c, dev, buf, h, bytes, kOut);
}

Task device_reduce(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count, DType dt,
                   ReduceOp op, int root, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  char* hin = c.staging(bytes);
  char* hout = t->rank == root ? c.staging(bytes) : hin;
  device_copy(c, dev, hin, in, bytes, kIn);
  co_await group_reduce(c, t, hin, hout, count, dt, op, root, seq);
  if (t->rank == root) device_copy(c, dev, out, hout, bytes, kOut);
}

Task device_all_to_all(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out,
                       std::vector<size_t> send_counts, std::vector<size_t> recv_counts, DType dt, uint64_t seq) {
  size_t sent = 0, received = 0;
  for (size_t n : send_counts) sent += n;
  for (size_t n : recv_counts) received += n;
  const size_t es = dtype_size(dt);
  char* hin = c.staging(sent * es);
  char* hout = c.staging(received * es);
  device_copy(c, dev, hin, in, sent * es, kIn);
  co_await group_all_to_all(c, t, hin, hout, std::move(send_counts), std::move(recv_counts), dt, seq);
  device_copy(c, dev, out, hout, received * es, kOut);
}

Task device_send(OpCtx& c, Topology* t, device::Device* dev, MemoryKind kind, const void* buf, void* nic,
                 int nic_device, size_t bytes, int peer, int tag) {
  if (nic != nullptr) {
    c.set_device_memory(kind, nic_device);
    co_await algo::send(c, &t->p2p, peer, nic, bytes, static_cast<uint64_t>(tag));
    co_return;
  }
  char* h = c.staging(bytes);
  device_copy(c, dev, h, buf, bytes, kIn);
  co_await algo::send(c, &t->p2p, peer, h, bytes, static_cast<uint64_t>(tag));
}

Task device_recv(OpCtx& c, Topology* t, device::Device* dev, MemoryKind kind, void* buf, void* nic,
                 int nic_device, size_t bytes, int peer, int tag) {
  if (nic != nullptr) {
    c.set_device_memory(kind, nic_device);
    co_await algo::recv(c, &t->p2p, peer, nic, bytes, static_cast<uint64_t>(tag));
    co_return;
  }
  char* h = c.staging(bytes);
  co_await algo::recv(c, &t->p2p, peer, h, bytes, static_cast<uint64_t>(tag));
  device_copy(c, dev, buf, h, bytes, kOut);
}

}  // namespace torus::comm::ofi
