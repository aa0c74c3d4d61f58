// The replay flag of activation recompute (replay.h).
#include "torus/parallel/replay.h"

namespace torus::parallel {
namespace {

thread_local int t_replay_depth = 0;

}  // namespace

bool replaying() { return t_replay_depth > 0; }

ReplayScope::ReplayScope() { ++t_replay_depth; }

ReplayScope::~ReplayScope() { --t_replay_depth; }

}  // namespace torus::parallel
