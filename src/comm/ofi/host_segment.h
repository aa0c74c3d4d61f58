// Private: the shared-memory segment through which the ranks of one group
// that share a host run their collectives (host_collectives.h).
//
// Layout (one POSIX shm object per group and host, mapped by every local
// member; L = local ranks, C = stripe bytes, D = depth):
//
//   Header | Control[L] | Staging[0] | ... | Staging[L-1]
//   Staging[i] = D in-slots of L*C bytes, then D out-slots of C bytes
//
// Each local rank writes only its own Control and Staging; peers read them.
// Control holds three round counters (monotonic over the life of the group,
// each on its own cache line): `copied` (my in-slot of that round is full),
// `reduced` (my out-slot is full), `consumed` (I am done reading everybody's
// slots of that round), and a ring of mailboxes (data of up to 56 bytes
// with its round number in one line). A rank reuses its slots of round r for round
// r + D, and its mailbox of round r for round r + kMailboxes, only once
// every peer has consumed round r (Note [Segment rounds] in host_rounds.h).
//
// Rendezvous (constructor, collective over the local members): local rank 0
// creates the object under a name unique to the job and group, exclusively,
// mode 0600, and publishes the name through the Store; the others open and
// map it; every rank records its pid and counts itself in; rank 0 unlinks
// the name as soon as all are attached, so nothing is left behind even if
// the job dies later.
//
// Failure: a member that breaks the group sets the header's abort word (with
// its reason); waiters see it at once. A waiter also checks, at most every
// 50 ms, that the peers it waits for are not dying or gone (liveness.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "torus/comm/store.h"

namespace torus::comm::ofi {

struct alignas(64) SegmentCounter {
  std::atomic<uint64_t> value{0};
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the segment needs lock-free 64-bit atomics");

// A message of a few bytes and the round it belongs to in one cache line:
// a reader gets both with a single transfer (tiny all_reduces).
struct alignas(64) SegmentMailbox {
  static constexpr size_t kBytes = 56;
  std::atomic<uint64_t> round{0};
  char data[kBytes];
};

// Note [Op signatures]: at the start of each host op a rank publishes what
// it was asked to do — op, dtype, reduce op, root and element count — in a
// ring indexed by the op's first round. A peer that sees this rank reach
// that round compares the entry with its own op and fails at once when
// they differ (a rank that passes 5 elements where the others pass 4 would
// otherwise get a silent wrong result). `round` is cleared while `what` is
// rewritten, so a reader that sees the same round before and after reading
// `what` read a whole entry.
struct alignas(64) SegmentOpSigs {
  static constexpr uint64_t kRing = 4;
  struct Entry {
    std::atomic<uint64_t> round{0};
    std::atomic<uint64_t> what{0};
  };
  Entry ring[kRing];
};

struct SegmentControl {
  SegmentCounter copied;
  SegmentCounter reduced;
  SegmentCounter consumed;
  static constexpr uint64_t kMailboxes = 8;
  SegmentMailbox mailbox[kMailboxes];  // by round, round % kMailboxes
  SegmentOpSigs sigs;                  // Note [Op signatures]
  alignas(64) int32_t pid = 0;
  int32_t world_rank = -1;
};

class HostSegment {
 public:
  struct Config {
    std::string name;         // shm object name, "/torus-..."; unique per job, group and host
    std::string store_key;    // Store key prefix for the rendezvous
    int local_rank = 0;
    int local_size = 2;
    int world_rank = 0;
    size_t stripe_bytes = 64 << 10;
    int depth = 4;
    // Sizes that pick an op's protocol (OfiOptions shm_eager_bytes and
    // shm_zero_copy_bytes): every local rank must have the same, or their
    // rounds would not match; attaching checks it.
    uint64_t eager_bytes = 0;
    uint64_t zero_copy_bytes = 0;
    std::chrono::milliseconds timeout{60000};
  };
  // Collective over the local members. Throws CommError (shm calls) or
  // TimeoutError (a member did not arrive).
  HostSegment(const Config& config, Store& store);
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  size_t stripe_bytes() const { return stripe_; }
  int depth() const { return depth_; }

  SegmentControl& control(int local_rank) const;
  // The mailbox of `local_rank` for `round` (a ring, SegmentControl::kMailboxes).
  SegmentMailbox& mailbox(int local_rank, uint64_t round) const {
    return control(local_rank).mailbox[round % SegmentControl::kMailboxes];
  }
  // In-slot of `local_rank` for `round` (L * stripe_bytes bytes).
  char* in_slot(int local_rank, uint64_t round) const;
  // Out-slot of `local_rank` for `round` (stripe_bytes bytes).
  char* out_slot(int local_rank, uint64_t round) const;

  // Sets the abort word (first reason wins); waiters throw CommError.
  void mark_aborted(int world_rank, const std::string& reason);
  // Empty when not aborted, else "world rank R: reason".
  std::string aborted() const;
  bool is_aborted() const;
  // World rank of a member process that no longer exists, or -1.
  int find_dead_member() const;

 private:
  struct Header;
  Header* header() const;
  int local_rank_, local_size_;
  size_t stripe_;
  int depth_;
  size_t staging_bytes_ = 0;  // per rank
  size_t map_bytes_ = 0;
  char* base_ = nullptr;
  size_t control_offset_ = 0, staging_offset_ = 0;
};

}  // namespace torus::comm::ofi
