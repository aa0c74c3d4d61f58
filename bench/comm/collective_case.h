// bench/comm/collective_case.h — one collective at one size on a Torus
// backend: its buffers, its data, issuing it, and checking its result.
//
// The data follow bench/common/pattern.h, so every result has a closed-form
// expectation and wrong() counts the elements that differ. Outputs are
// poisoned with 0xFF bytes before an op (a NaN in every float dtype, a value
// no reduction of the pattern produces in the integer ones), so an element
// the op never wrote is counted as wrong.
//
// Placements (which column of the table a measurement goes to):
//   op              out-of-place          in-place
//   all_reduce      in -> out             out -> out
//   reduce_scatter  in -> out             out = in + rank*block
//   all_gather      in -> out             in = out + rank*block
//   all_to_all      in -> out             (none: the Backend forbids aliasing)
//   broadcast       (none)                buf (the only form the Backend has)
//   reduce          in -> out             out -> out
//
// Not thread safe; one case is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/pattern.h"
#include "torus/comm/backend.h"

namespace torus::bench {

enum class Placement { kOutOfPlace, kInPlace };

// Where a case's buffers come from:
//  kTensor: LibTorch's CPU allocator, as a tensor's storage would (after
//           comm::maybe_install_shared_host_allocator, the shared host
//           allocator where Torus installs it by default);
//  kHeap:   ordinary heap memory (aligned_alloc);
//  kShared: torus::comm::shared_host_alloc (Note [Shared host buffers]).
enum class BufferKind { kTensor, kHeap, kShared };

class CollectiveCase {
 public:
  // `bytes` is the requested size; count() follows the rules of sweep.h.
  // `root` matters for broadcast and reduce, `redop` for the reductions.
  // `buffers`: where the input and output come from (BufferKind).
  CollectiveCase(comm::Backend& backend, comm::OpType op, DType dtype, comm::ReduceOp redop, int root, size_t bytes,
                 comm::Duration timeout, BufferKind buffers = BufferKind::kHeap);

  size_t count() const { return count_; }
  size_t bytes() const { return count_ * elt_; }
  bool has(Placement p) const;

  // Fills the inputs from the pattern and poisons the outputs.
  void prepare(Placement p);
  // Issues the op once; the caller waits on the Work.
  comm::WorkPtr issue(Placement p);
  // This rank's #wrong, after prepare(p), issue(p) and the wait.
  int64_t wrong(Placement p) const;

 private:
  struct FreeDeleter {
    void (*free)(void*);  // no initializer: value-initialized (null) by unique_ptr
    void operator()(void* p) const { free(p); }
  };
  using Buffer = std::unique_ptr<std::byte, FreeDeleter>;
  static Buffer allocate(size_t bytes, BufferKind kind);

  std::byte* in_place_input();  // where the input lies for the in-place form
  std::byte* in_place_output();

  comm::Backend& backend_;
  comm::OpType op_;
  DType dtype_;
  comm::ReduceOp redop_;
  int root_;
  comm::Duration timeout_;
  int rank_, n_;
  size_t elt_, count_, block_;  // block_: elements per rank for the split ops
  Pattern pattern_;
  Buffer in_, out_;
  size_t in_bytes_ = 0, out_bytes_ = 0;
  std::vector<size_t> split_counts_;  // all_to_all: block_ per peer
};

}  // namespace torus::bench
