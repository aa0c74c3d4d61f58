// Private: how many ops of this process have failed so far (any backend,
// any group). A process that saw one may be missing a peer for good, which
// its teardown must not wait for (Context::~Context). Thread safe.
#pragma once

#include <cstdint>

namespace torus::comm {

uint64_t failed_ops_in_process();

}  // namespace torus::comm
