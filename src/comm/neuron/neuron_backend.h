// Private: the `neuron` comm backend — collectives on Neuron device memory
// through the Neuron runtime's host-driven ("out-of-NEFF") collectives
// (nrt_cc_global_comm_init, nrta_cc_prepare, nrta_cc_schedule,
// nrta_is_completed; runtime 2.31 or later). Built with TORUS_WITH_NEURON.
//
// Contracts beyond backend.h:
//  * Buffers are Neuron device memory (device_type() is kNeuron): pointers
//    from the Neuron device (device.h), at any offset inside an allocation.
//    A host pointer is refused with InvalidArgument before communicating.
//  * Capability (supports()): what the runtime offers without a NEFF —
//    all_reduce, reduce_scatter and all_gather (and barrier, a one-element
//    all_reduce) on f32, f16, bf16, i32, i64 and u8, with sum, max and min.
//    The runtime has no host-driven broadcast, all-to-all, reduce, product or
//    average, and no f64: those throw Unsupported naming the runtime version.
//    send/recv are refused too: the runtime's point-to-point API
//    (nrt_async_sendrecv_*) connects by IP address and is not wired into
//    this backend yet (docs/neuron.md).
//  * Groups: one rank per NeuronCore. A host may run at most as many ranks as
//    it has visible NeuronCores (each rank uses core local_rank); the world
//    refuses more. Any group size is accepted otherwise: host-driven
//    collectives run a ring (the runtime disables its mesh algorithms for
//    them), which has no size restriction. split() exchanges (color, key)
//    with an all_gather on the parent group.
//  * Completion: every op is scheduled on the runtime's collectives queue 0
//    in issue order and completes when nrta_is_completed says so; its status
//    (the runtime writes it at completion) turns a failed op into CommError.
//    Deadlines and group breaking are the NCCL watchdog's policy
//    (comm/nccl/watchdog.h, shared): the first op past its deadline fails
//    with TimeoutError naming rank, group, op, sequence number and sizes,
//    the others with CommError, and the group stays broken.
//  * The runtime cannot cancel a scheduled collective: after a timeout the
//    runtime may still write into the op's output, so the backend keeps the
//    op's slice tensors alive for the rest of the process, and the caller
//    must not reuse the buffers of a failed op.
//  * Thread safe; ops are matched across ranks in issue order.
#pragma once

#include "torus/comm/backend.h"
#include "torus/comm/context.h"

namespace torus::comm {

// The world backend: group "world" over every rank of the launch. Selects
// this rank's NeuronCore (local_rank), initialises the runtime's global
// communicator (nrt_cc_global_comm_init) and checks that the runtime offers
// host-driven collectives. Throws Error when the runtime is unavailable,
// Unsupported when it is too old, InvalidArgument when a host has more ranks
// than NeuronCores. init.launch is required; the store is not used (the
// runtime rendezvous through NEURON_RT_ROOT_COMM_ID, docs/neuron.md).
BackendPtr create_neuron_world_backend(const BackendInit& init);

}  // namespace torus::comm
