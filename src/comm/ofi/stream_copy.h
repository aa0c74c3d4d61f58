// Private: a copy with non-temporal stores, for large results the caller
// will not read again soon (the host segment's output stripes). It skips the
// read-for-ownership of the destination lines and keeps the shared cache for
// the staging stripes peers are about to read: for a 64 MiB all_reduce this
// takes a third of the memory traffic off each rank.
#pragma once

#include <cstddef>

namespace torus::comm::ofi {

// dst = src, n bytes, non-overlapping. Ends with a store fence, so the data
// is ordered before any later flag or release store. AVX-512 or AVX2 chosen
// at run time; memcpy otherwise.
void stream_copy(void* dst, const void* src, size_t n);

// The same without the fence: for many pieces in a row, each fence would
// wait for the previous piece to reach memory. The caller fences once
// (_mm_sfence) before it publishes the data.
void stream_copy_unfenced(void* dst, const void* src, size_t n);

}  // namespace torus::comm::ofi
