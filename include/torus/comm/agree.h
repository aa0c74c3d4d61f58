// torus/comm/agree.h — whether a local step succeeded on every rank of a
// group: the agreement that makes a collective operation built of local
// steps that may fail on some ranks (a file written, a device copy) fail on
// every rank or on none, instead of leaving the others waiting in the next
// collective. LibTorch-free.
//
// One i32 max of "failed" over the group, staged through a 4-byte buffer
// in the memory of the group's device (group.device_type()), so that it
// works on every backend (host and device memory alike).
#pragma once

#include "torus/comm/types.h"

namespace torus::comm {

class Backend;

// Collective over `group`: true when `ok` is true on every rank. Throws the
// collective's CommError/TimeoutError, or the device's error when the
// staging buffer cannot be allocated or copied.
bool all_ok(Backend& group, bool ok, Duration timeout);

}  // namespace torus::comm
