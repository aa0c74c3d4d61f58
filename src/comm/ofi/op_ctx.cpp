// OpCtx — what an algorithm coroutine sees of its op (engine.h) — and the
// engine's scratch-memory pool.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <set>

#include "comm/ofi/engine.h"
#include "comm/ofi/ofi_check.h"

namespace torus::comm::ofi {
namespace {

constexpr size_t kMaxPooledScratch = 8;
constexpr size_t kMaxPooledStagingBytes = size_t{16} << 20;

}  // namespace

OpCtx::OpCtx(Engine& engine, Op& op) : engine_(engine), op_(op) {}

const WorkInfo& OpCtx::info() const { return op_.work->info(); }
Clock::time_point OpCtx::deadline() const { return op_.deadline; }

OpCtx::~OpCtx() {
  root.reset();  // destroy the coroutine frames before the memory they used
  abandon();
  for (auto& s : scratch_) engine_.return_scratch(std::move(s));
}

Request* OpCtx::send(const PeerView& v, int peer, const void* buf, size_t bytes, uint64_t payload) {
  return post(true, v, peer, const_cast<void*>(buf), bytes, payload);
}

Request* OpCtx::recv(const PeerView& v, int peer, void* buf, size_t bytes, uint64_t payload) {
  return post(false, v, peer, buf, bytes, payload);
}

Request* OpCtx::post(bool is_send, const PeerView& v, int peer, void* buf, size_t bytes, uint64_t payload) {
  Fabric& f = engine_.fabric();
  TORUS_CHECK(bytes <= f.max_msg_size(), CommError, "{}: message of {} bytes exceeds the provider's maximum {}",
              info().describe(), bytes, f.max_msg_size());
  void* d = desc(buf, bytes);
  Request* r = engine_.new_request();
  r->what = is_send ? "send to" : "recv from";
  r->peer = v.world[static_cast<size_t>(peer)];
  r->bytes = bytes;
  r->is_send = is_send;
  r->buf = buf;
  r->desc = d;
  r->addr = v.addr[static_cast<size_t>(peer)];
  r->tag = make_tag(v.base, is_send ? v.rank : peer, payload);
  try {
    engine_.post(r);
  } catch (...) {
    engine_.release(r);
    throw;
  }
  if (r->state == Request::State::kFailed) {  // refused: the peer is gone (Note [Never send to the dead])
    std::string error = std::move(r->error);
    engine_.release(r);
    failed_peer_ = v.world[static_cast<size_t>(peer)];
    throw CommError(fmt::format("{} failed: {} world rank {} ({} bytes): {}", info().describe(),
                                is_send ? "send to" : "recv from", failed_peer_, bytes, error));
  }
  r->next = live_;
  if (live_ != nullptr) live_->prev = r;
  live_ = r;
  return r;
}

void OpCtx::finish(Request* r) {
  if (r == nullptr) return;
  if (r->state == Request::State::kFailed) {
    failed_peer_ = r->peer;
    throw CommError(fmt::format("{} failed: {} world rank {} ({} bytes): {}", info().describe(), r->what, r->peer,
                                r->bytes, r->error));
  }
  // A collective's messages have the sizes every rank derives from the same
  // arguments; a short one means the ranks were called with different
  // sizes, which must not pass as a result.
  if (op_.collective && !r->is_send && r->state == Request::State::kDone && r->got != r->bytes) {
    failed_peer_ = r->peer;
    throw InvalidArgument(fmt::format(
        "{} failed: the message from world rank {} holds {} bytes where this rank expects {}: the ranks passed "
        "different sizes to this collective",
        info().describe(), r->peer, r->got, r->bytes));
  }
  if (r->prev != nullptr) r->prev->next = r->next;
  if (r->next != nullptr) r->next->prev = r->prev;
  if (live_ == r) live_ = r->next;
  engine_.release(r);
}

void OpCtx::finish_all(std::vector<Request*>& rs) {
  for (Request* r : rs) {
    if (r->state == Request::State::kFailed) finish(r);  // throws
  }
  for (Request* r : rs) finish(r);
  rs.clear();
}

char* OpCtx::scratch(size_t bytes) {
  if (detached_) {
    auto s = std::make_unique<Scratch>();
    const size_t rounded = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
    s->data.reset(static_cast<char*>(std::aligned_alloc(64, rounded)));
    TORUS_CHECK(s->data != nullptr, CommError, "ofi: out of memory allocating {} bytes of scratch", rounded);
    s->bytes = rounded;
    own_scratch_.push_back(std::move(s));
    return own_scratch_.back()->data.get();
  }
  scratch_.push_back(engine_.lend_scratch(bytes));
  return scratch_.back()->data.get();
}

char* OpCtx::staging(size_t bytes) {
  char* p = scratch(bytes);
  if (bytes > kMaxPooledStagingBytes && !detached_) scratch_.back()->pooled = false;
  return p;
}

void* OpCtx::desc(const void* buf, size_t bytes) {
  Fabric& f = engine_.fabric();
  const bool device = mem_kind_ != MemoryKind::kHost;
  if ((!f.needs_local_mr() && !device) || bytes == 0) return nullptr;
  const char* p = static_cast<const char*>(buf);
  for (auto& s : scratch_) {
    if (p >= s->data.get() && p + bytes <= s->data.get() + s->bytes) return s->mr.desc();
  }
  for (auto& r : regs_) {
    if (p >= r.base && p + bytes <= r.base + r.bytes) return r.mr.desc();
  }
  regs_.push_back({p, bytes, f.register_memory(p, bytes, FI_SEND | FI_RECV, mem_kind_, mem_device_)});
  return regs_.back().mr.desc();
}

std::string OpCtx::describe_pending() const {
  std::set<std::string> items;
  for (Request* r = live_; r != nullptr; r = r->next) {
    if (!r->done()) {
      items.insert(fmt::format("{} world rank {}{}", r->what, r->peer,
                               r->state == Request::State::kQueued ? " (not yet taken by the provider)" : ""));
    }
  }
  if (items.empty()) return "its own progress";
  return fmt::format("{}", fmt::join(items, ", "));
}

std::string OpCtx::describe_wait() const {
  if (susp_.ready != nullptr && susp_.describe != nullptr) return susp_.describe(susp_.arg);
  return describe_pending();
}

int OpCtx::find_dead_local_peer() const {
  int checked[4] = {-1, -1, -1, -1};  // peers already found alive (most ops wait on one or two)
  int n = 0;
  for (Request* r = live_; r != nullptr; r = r->next) {
    if (r->done() || r->peer < 0 || std::find(checked, checked + n, r->peer) != checked + n) continue;
    if (engine_.peer_gone(r->peer, true)) return r->peer;
    if (n < 4) checked[n++] = r->peer;
  }
  return -1;
}

void OpCtx::abandon() {
  bool pending = false;
  for (Request* r = live_; r != nullptr;) {
    Request* next = r->next;
    if (r->done()) {
      engine_.release(r);
    } else if (r->state == Request::State::kQueued) {
      r->orphan = true;  // the engine drops it instead of posting it
    } else {
      engine_.fabric().cancel(&r->fi_ctx);
      r->orphan = true;
      pending = true;
    }
    r = next;
  }
  live_ = nullptr;
  if (pending) {
    // The provider may still write into these until the cancellation lands.
    std::vector<MemoryRegion> regs;
    for (auto& r : regs_) regs.push_back(std::move(r.mr));
    regs_.clear();
    engine_.bury(scratch_, regs);
  }
}

// --- scratch pool ------------------------------------------------------------------------

std::unique_ptr<Scratch> Engine::lend_scratch(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  auto best = scratch_pool_.end();
  for (auto it = scratch_pool_.begin(); it != scratch_pool_.end(); ++it) {
    if ((*it)->bytes >= bytes && (best == scratch_pool_.end() || (*it)->bytes < (*best)->bytes)) best = it;
  }
  if (best != scratch_pool_.end()) {
    auto s = std::move(*best);
    scratch_pool_.erase(best);
    return s;
  }
  auto s = std::make_unique<Scratch>();
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  s->data.reset(static_cast<char*>(std::aligned_alloc(4096, rounded)));
  TORUS_CHECK(s->data != nullptr, CommError, "ofi: out of memory allocating {} bytes of scratch", rounded);
  s->bytes = rounded;
  if (fabric_->needs_local_mr()) s->mr = fabric_->register_memory(s->data.get(), rounded, FI_SEND | FI_RECV);
  return s;
}

void Engine::return_scratch(std::unique_ptr<Scratch> s) {
  if (!s) return;
  if (!s->pooled) return;  // OpCtx::staging: freed here
  scratch_pool_.push_back(std::move(s));
  if (scratch_pool_.size() > kMaxPooledScratch) {
    auto smallest = std::min_element(scratch_pool_.begin(), scratch_pool_.end(),
                                     [](const auto& a, const auto& b) { return a->bytes < b->bytes; });
    scratch_pool_.erase(smallest);
  }
}

void Engine::bury(std::vector<std::unique_ptr<Scratch>>& scratch, std::vector<MemoryRegion>& regs) {
  for (auto& s : scratch) graveyard_scratch_.push_back(std::move(s));
  scratch.clear();
  for (auto& r : regs) graveyard_regs_.push_back(std::move(r));
  regs.clear();
}

}  // namespace torus::comm::ofi
