// Private: the 64-bit tag space of the ofi backend, and PeerView, the set of
// ranks an algorithm talks to.
//
// Note [Tag layout]: one endpoint serves every group of a world, so a tag
// says which group, which kind of traffic, who sent it and which op:
//
//   63      52 51  50 49            34 33                          0
//   [ context ][ kind ][ sender rank   ][ payload                    ]
//     12 bits   2 bits    16 bits          34 bits
//
//  * context: 0 for the world, one fresh id per split (from the Store).
//  * kind: collective traffic of the whole group, point to point, or one of
//    the two sub-views a hierarchical collective uses (the ranks with one
//    local index across hosts; one leader per host).
//  * sender rank: rank within the view, so receives match one sender
//    without FI_DIRECTED_RECV.
//  * payload: the collective's sequence number, or the user's p2p tag.
// Messages of one op between one pair share one tag; the provider's
// send-after-send ordering matches them in order.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <vector>

namespace torus::comm::ofi {

inline constexpr int kContextBits = 12;
inline constexpr int kKindBits = 2;
inline constexpr int kSenderBits = 16;
inline constexpr int kPayloadBits = 34;
static_assert(kContextBits + kKindBits + kSenderBits + kPayloadBits == 64);
inline constexpr uint32_t kMaxContexts = 1u << kContextBits;
inline constexpr int kMaxGroupSize = 1 << kSenderBits;
inline constexpr uint64_t kPayloadMask = (uint64_t{1} << kPayloadBits) - 1;

enum class TagKind : uint64_t { kCollective = 0, kP2P = 1, kCross = 2, kLeaders = 3 };

constexpr uint64_t tag_base(uint32_t context, TagKind kind) {
  return (uint64_t{context} << (64 - kContextBits)) | (static_cast<uint64_t>(kind) << (kSenderBits + kPayloadBits));
}
constexpr uint64_t make_tag(uint64_t base, int sender, uint64_t payload) {
  return base | (static_cast<uint64_t>(sender) << kPayloadBits) | (payload & kPayloadMask);
}

// A set of ranks seen by one algorithm: the whole group, or a sub-view of a
// hierarchical collective. Ranks in the view are 0..size-1.
struct PeerView {
  uint64_t base = 0;             // tag_base(context, kind)
  int rank = 0;                  // this process's rank in the view
  std::vector<fi_addr_t> addr;   // by view rank
  std::vector<int> world;        // world rank by view rank (errors, liveness)
  int size() const { return static_cast<int>(addr.size()); }
};

}  // namespace torus::comm::ofi
