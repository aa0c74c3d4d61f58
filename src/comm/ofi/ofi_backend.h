// Private: the `ofi` host backend — Torus's own collectives over libfabric
// (EFA on AWS; shm and tcp elsewhere), plus a shared-memory segment for the
// ranks of a group that share a host. docs/ofi.md describes the design.
//
// Contracts beyond backend.h:
//  * Host memory only (device_type() is kCPU); every (op, dtype, reduce op)
//    of types.h is supported. f16/bf16 are reduced in f32 and rounded once
//    per reduction stage (once on one host; once per stage when
//    hierarchical). kAvg is a sum divided by size() (integers truncate).
//  * In place: all_reduce/reduce take in == out; all_gather takes
//    in == out + rank*count; reduce_scatter takes out == in + rank*count
//    (the other blocks of `in` are left unchanged).
//  * recv fails with CommError if the matched message is longer than the
//    buffer (truncation) or shorter than `count` elements.
//  * Issue calls never block on peers; ops are queued to the world's progress
//    engine (engine.h, Note [Op order]): collectives of a group run one at a
//    time in issue order, point-to-point ops start at once in issue order.
//    Work::wait() drives progress itself (lowest latency).
//  * Deadlines and failures: Note [Deadlines] in work.h; engine.h, Note
//    [Failure]: a dead peer or a peer that aborted makes the others fail with
//    CommError naming it, else the deadline fires with TimeoutError naming
//    what was awaited. A broken group fails later ops at once.
//  * split() is collective over the parent group and exchanges (color, key)
//    and the new group's tag context through the Store; the new group shares
//    the world's endpoint (its own tag context) and makes its own host
//    segment. Blocks up to `timeout`.
//  * Destroying a backend never blocks; its queued ops still run (or fail
//    when the last backend of the world goes and the engine stops).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/ofi/ofi_options.h"
#include "torus/comm/backend.h"
#include "torus/comm/context.h"

namespace torus::comm {

// The world backend: group "world" over every rank of the job. Collective:
// every rank calls it; it publishes this rank's endpoint address through
// init.store and waits for all others (init.timeout, else TORUS_TIMEOUT_MS).
// Needs init.launch, init.hosts and init.store. Options come from the
// environment (ofi_options.h). Throws InvalidArgument on a bad init,
// CommError when no provider fits, TimeoutError when peers do not arrive.
BackendPtr create_ofi_world_backend(const BackendInit& init);

namespace ofi {
// As above with explicit options (tests, tools).
BackendPtr create_world_backend(const BackendInit& init, const OfiOptions& options);

// The record each rank publishes in the store (`addr/<rank>`) at world
// creation: its pid and the fd of its provider mark (-1: none), for
// same-host liveness; its provider's name; its endpoint address, whose
// length may differ from rank to rank (fabric.h).
std::vector<uint8_t> endpoint_record(int32_t pid, int32_t mark_fd, const std::string& provider,
                                     const std::vector<uint8_t>& address);
}  // namespace ofi

}  // namespace torus::comm
