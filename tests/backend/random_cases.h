// The randomized collective test: what a case is, how every rank derives it
// from (seed, case index), and the reference values it is checked against.
//
// Every rank of a job builds the same case list and the same group pool from
// the seed alone, and every rank can compute every rank's inputs, so each
// rank checks its own outputs against an independent reference with no
// communication beyond the op under test (random_collectives.cpp runs them).
//
// Reference values (exact, so that comparisons are bit for bit):
//  * Reductions of floating types use inputs on a grid chosen so that every
//    partial sum in any order is exact in f32 (f64: in f64); the reference
//    is the exact result rounded once to the dtype, which is the contract
//    for f16/bf16 (widened to f32, reduced in f32, rounded once). Inputs for
//    f16/bf16 sums may exceed the type's exact integer range, so the final
//    rounding matters; "probe" columns (one rank 2^e, some others half an
//    ulp of it, the rest 0: bf16 256+1+1+0 = 258, f16 2048+1+1+0 = 2050)
//    make a second rounding visible.
//  * avg on floating types: inputs whose sum is a multiple of the group size
//    (the quotient is exact); on integers the sum divided with truncation.
//  * prod: factors +-1, +-2 (+-0.5 for floats), at most 6 of magnitude 2
//    per element, so no product overflows any dtype.
//  * Integer sums stay inside the dtype (u8: 0..255/n per rank).
//  * Data movement (all_gather, all_to_all, broadcast, send/recv) moves
//    random bit patterns that must arrive unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::rc {

// Stateless 64-bit mixing (the murmur3 finalizer): per-element values are
// hash(key, index) so that any rank computes any element on its own.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
constexpr uint64_t hash2(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + 0x9e3779b97f4a7c15ull));
}

enum class Kind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kReduce,
  kSendRecv,
  kBarrier
};
inline constexpr int kNumKinds = 8;
std::string_view kind_name(Kind k);

// Where a rank's buffers of one op live: heap memory (64-byte aligned, or
// one element past that), or shared host memory (shared_host.h: a pool
// block or a single allocation), again aligned or one element in. Shared
// buffers on every rank of a same-host group take the ofi zero-copy path.
enum class Place : uint8_t { kHeap, kHeapOffset, kShared, kSharedOffset };
std::string_view place_name(Place p);

enum class Values : uint8_t { kRandom, kProbe };

struct Message {
  int src = 0, dst = 0;  // group ranks
  size_t count = 0;
  int tag = 0;
};

struct Op {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp rop = ReduceOp::kSum;
  // all_reduce, reduce, broadcast: the buffer; reduce_scatter: one block
  // (the output); all_gather: one rank's input.
  size_t count = 0;
  int root = 0;  // broadcast, reduce (group rank)
  bool in_place = false;
  bool null_out = false;  // reduce: non-roots pass out == nullptr
  Values values = Values::kRandom;
  int scale = 0;              // exponent of the value grid (floating reductions)
  std::vector<size_t> a2a;    // all_to_all: n x n counts, [src * n + dst]
  std::vector<Message> msgs;  // send/recv, in the order every rank posts its own
  std::vector<Place> place;   // per group rank
  uint64_t key = 0;           // seeds this op's values
  int group = 0;              // index into Pool::groups
  // One line: "all_reduce sum bf16 count 1031 in-place probe".
  std::string describe() const;
};

// A partition of the world into groups, made with split(color, key) from a
// dedicated full-size parent (the "splitter"), so that parent ranks are
// world ranks. color < 0: the rank joins no group.
struct Partition {
  std::vector<int> color, key;  // per world rank
};

// A group of the pool: world (partition -1) or one color of a partition.
struct GroupSpec {
  int partition = -1;
  int color = 0;
  std::vector<int> members;  // world ranks in group-rank order (by key, then world rank)
  std::string name;
};

// Members of `color` in `p`, in the order split() must give them.
std::vector<int> members_of(const Partition& p, int color);

// The pool for a world of n ranks: world first, then every group of a fixed
// set of partitions (all singletons, odd/even, reversed, one that leaves a
// rank out) and random ones.
struct Pool {
  std::vector<Partition> partitions;
  std::vector<GroupSpec> groups;
};
Pool make_pool(uint64_t seed, int world_size, int random_partitions);

// Case generation limits (cases depend on them: rerun a case with the same).
struct Limits {
  size_t max_bytes = size_t{1} << 20;  // the largest buffer of any rank in any op
};

// How a rank waits for its Works: wait(timeout) up to a little past the
// deadline, wait() (the backend's deadline must end it), or polling
// is_completed() (progress must not depend on a waiter).
enum class WaitStyle : uint8_t { kWaitTimeout, kWait, kPoll };

// A case: one op, or a batch of ops on one group or on several groups (each
// rank issues all of its own, in order, before waiting for any), or a
// split of the world.
struct Case {
  uint64_t index = 0;
  bool split = false;         // a dynamic split of the whole world
  Partition split_partition;  // its colors and keys
  std::vector<Op> ops;
  // Ops on several groups: each rank issues them in an order of its own
  // (ops of one group keep their order), and with `threaded` from one
  // thread per group.
  bool shuffled = false;
  bool threaded = false;
  WaitStyle wait = WaitStyle::kWaitTimeout;
  bool reverse_wait = false;  // wait for the Works last to first
  bool multi_group() const;
};

Case make_case(uint64_t seed, uint64_t index, const Pool& pool, int world_size, const Limits& limits);

// ---------------------------------------------------------------------------
// Values

// A number as the reference holds it: exact double for floating dtypes,
// int64 for integer ones.
struct Num {
  double f = 0;
  int64_t i = 0;
};

// Encodes v into dtype `t` at p (floating: one round-to-nearest-even from
// the double; integers: the low bytes of the int64).
void encode(DType t, const Num& v, void* p);
// Decodes the element at p; the second form for printing.
Num decode(DType t, const void* p);
std::string format_element(DType t, const void* p);

// The inputs of every group rank for element i of a reduction (n values).
class ReductionInputs {
 public:
  ReductionInputs(const Op& op, int n);
  void column(size_t i, Num* out) const;
  // The reduction of a column, encoded into the op's dtype at `p`.
  void expected(const Num* column, void* p) const;

 private:
  const Op& op_;
  int n_;
  bool floating_;
};

// Random bits for data movement: element j of stream (a, b) of op `key`.
void movement_element(DType t, uint64_t key, uint64_t a, uint64_t b, size_t j, void* p);

// Checks the reference against values worked out by hand (bf16 256+1+1+0
// = 258, f16 2048+1+1+0 = 2050, ties to even, truncating integer avg...);
// returns "" or what is wrong.
std::string check_reference();

// Case families that --exclude can name (besides op and dtype names).
// a2a-mixed-equal: an all_to_all where some rank's send and receive counts
// are all equal and another rank's are not. half-multi-host: an f16/bf16
// all_reduce or reduce on a group that spans several hosts with two or more
// ranks on one of them (a hierarchical reduction).
bool a2a_mixed_equal(const Op& op, int n);
bool half_multi_host(const Op& op, const std::vector<int>& member_hosts);

}  // namespace torus::comm::rc
