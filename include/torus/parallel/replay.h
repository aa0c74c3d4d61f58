// torus/parallel/replay.h — whether the forward running on this thread is a
// replay: activation recompute running a block's forward a second time, in
// backward (recompute.h, Note [Recompute replay]).
//
// The recompute layer holds a ReplayScope around each replay; layers that
// record statistics of a forward (MoE routing counts, moe.h) skip the
// statistics while replaying() is true, so that a recomputed forward is
// counted once. The flag lives in the parallel layer, below recompute, so
// that nothing in parallel/ includes recompute/.
//
// Threading: the flag is thread local. The engine runs a replay on the thread
// of the node that started it (Note [Inner backward], backward_callback.h),
// and the replayed forward runs there too, so it sees the flag. Scopes nest;
// neither call throws.
#pragma once

namespace torus::parallel {

// True while a ReplayScope is alive on this thread.
bool replaying();

// Marks a replay on this thread while alive. Not copyable.
class ReplayScope {
 public:
  ReplayScope();
  ~ReplayScope();
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;
};

}  // namespace torus::parallel
