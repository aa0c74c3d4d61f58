// Private: what one ofi group knows about its ranks and hosts, and the
// topology-aware collectives that pick an algorithm from it.
//
// Topology: ranks are grouped by host (from the bootstrap's HostMap; hosts
// ordered by their first group rank). The group uses its host segment when
// TORUS_OFI_HOST_SHM is on (default) and some host holds two or more of its
// ranks:
//  * one host: every collective runs on the segment;
//  * several hosts (hierarchical): all_reduce is a segment reduce-scatter,
//    an all_reduce over the provider among the ranks with the same local
//    index (every host has the same number of ranks, large messages) or
//    among one leader per host (otherwise), then a segment all-gather or
//    broadcast; broadcast and reduce go through one leader per host (the
//    root leads its host); barrier is segment, leaders, segment.
//    reduce_scatter, all_gather and all_to_all run flat over the provider.
//  * no segment: everything runs flat over the provider (algorithms.h).
// Point-to-point always uses the provider.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/ofi/algorithms.h"
#include "comm/ofi/engine.h"
#include "comm/ofi/host_collectives.h"
#include "comm/ofi/ofi_options.h"
#include "torus/comm/store.h"

namespace torus::device {
class Device;
}

namespace torus::comm::ofi {

// State shared by every group of one world.
struct World {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<Store> store;  // prefixed for this world
  OfiOptions options;
  algo::Tuning tuning;
  int rank = 0;
  int size = 1;
  std::vector<fi_addr_t> addr;  // by world rank
  std::vector<int> host_of;     // host index by world rank
  std::string nonce;            // unique to this world: names its shm objects
  std::chrono::milliseconds timeout{0};
  bool oversubscribed = false;  // this host runs more ranks than it has cores (OfiOptions::oversubscribed)
  // Note [Device buffers] (device_ops.cpp): the device whose memory the
  // world's ops take (null: host memory); whether point-to-point hands those
  // buffers to the provider (zero copy) and registered as what.
  device::Device* device = nullptr;
  bool device_zero_copy = false;
  MemoryKind device_kind = MemoryKind::kHost;

  // Note [Recycled contexts]: a split group's tag context (tags.h) goes back
  // to the world once every member destroyed the group cleanly (no failed
  // op, never aborted). A destroyed group is only noted here; the next
  // split of this process, which talks to the store anyway, counts it in
  // the store, and the member that completes the count puts the context on
  // the store's free list, where the first rank of a new group claims it.
  // Keys and shared-memory names use the group's instance (never reused),
  // so nothing of the old group is mistaken for the new one's.
  struct Released {
    uint32_t context;
    uint64_t instance;
    int size;
  };
  std::mutex released_mu;
  std::vector<Released> released;  // released_mu
  uint64_t free_scanned = 0;        // free-list slots this process has tried (released_mu)
};

struct Topology {
  int rank = 0, size = 1;
  PeerView full;                          // the whole group, collective traffic
  PeerView p2p;                           // the whole group, point to point
  std::vector<std::vector<int>> hosts;    // group ranks per host
  std::vector<int> host_of;               // host index per group rank
  int my_host = 0, local_rank = 0, local_size = 1;
  bool segment_on = false;                // the group uses host segments
  bool uniform = false;                   // every host has the same number of ranks
  PeerView cross;                         // same local index on every host (uniform only)
  PeerView leaders;                       // first rank of every host; rank -1 when not a leader
  std::unique_ptr<HostSegment> segment;   // when segment_on and local_size >= 2
  HostGroup host;                         // driver-only round state of `segment`
  algo::Tuning tuning;
  bool single_host() const { return hosts.size() == 1; }
};

// Builds the topology of a group whose members are `members` (world ranks, by
// group rank); creates its host segment (collective over the local members).
// `context` makes its tags, `instance` (unique over the world's life) names
// its host segment.
std::shared_ptr<Topology> make_topology(const World& w, uint32_t context, uint64_t instance,
                                        const std::vector<int>& members, int my_rank);

// Topology-aware collectives (see above). Count in elements; kAvg divides by
// the group size.
Task group_all_reduce(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, ReduceOp op,
                      uint64_t seq);
Task group_reduce_scatter(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, ReduceOp op,
                          uint64_t seq);
Task group_all_gather(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, uint64_t seq);
Task group_broadcast(OpCtx& c, Topology* t, void* buf, size_t count, DType dt, int root, uint64_t seq);
// The local index of group rank `root` on its host (the local root of the
// segment ops on the root's host; local rank 0 leads the others).
int local_root(const Topology* t, int root);
Task group_reduce(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, ReduceOp op, int root,
                  uint64_t seq);
Task group_all_to_all(OpCtx& c, Topology* t, const void* in, void* out, std::vector<size_t> send_counts,
                      std::vector<size_t> recv_counts, DType dt, uint64_t seq);
Task group_barrier(OpCtx& c, Topology* t, uint64_t seq);

// Note [Device buffers] (device_ops.cpp): the collectives above on buffers
// in `dev`'s memory, moved through host scratch (the same arguments).
Task device_all_reduce(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                       DType dt, ReduceOp op, uint64_t seq);
Task device_reduce_scatter(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                           DType dt, ReduceOp op, uint64_t seq);
Task device_all_gather(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count,
                       DType dt, uint64_t seq);
Task device_broadcast(OpCtx& c, Topology* t, device::Device* dev, void* buf, size_t count, DType dt, int root,
                      uint64_t seq);
Task device_reduce(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out, size_t count, DType dt,
                   ReduceOp op, int root, uint64_t seq);
Task device_all_to_all(OpCtx& c, Topology* t, device::Device* dev, const void* in, void* out,
                       std::vector<size_t> send_counts, std::vector<size_t> recv_counts, DType dt, uint64_t seq);
// Point to point: `buf` is the device pointer, `nic` its NicAddress when the
// world hands device buffers to the provider (else null: through scratch).
// `kind`: what the device buffers are registered as.
Task device_send(OpCtx& c, Topology* t, device::Device* dev, MemoryKind kind, const void* buf, void* nic,
                 int nic_device, size_t bytes, int peer, int tag);
Task device_recv(OpCtx& c, Topology* t, device::Device* dev, MemoryKind kind, void* buf, void* nic, int nic_device,
                 size_t bytes, int peer, int tag);

}  // namespace torus::comm::ofi
