// The engine's provider-facing side (engine.h): the request pool, posting
// with queueing when the provider is full, reading completions, and the
// control messages that announce a broken group to its peers.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "comm/ofi/engine.h"
#include "comm/ofi/ofi_check.h"
#include "comm/ofi/spin.h"

namespace torus::comm::ofi {
namespace {

constexpr uint32_t kControlMagic = 0x544f5231;  // "TOR1"
constexpr WaitPolicy kGateWait = wait_policy(Wait::kGate, false);
constexpr int kControlRecvs = 4;
constexpr int kCqBatch = 32;

// The abort notice a rank sends to its group's peers (Note [Failure]).
struct ControlMessage {
  uint32_t magic = kControlMagic;
  uint32_t context = 0;
  int32_t from_rank = -1;
  int32_t from_world = -1;
  int32_t gone_world = -1;  // a same-host peer of the sender found gone, or -1
  char reason[236] = {};
};

}  // namespace

// --- requests and completions ----------------------------------------------------

Request* Engine::new_request() {
  Request* r = free_;
  if (r != nullptr) {
    free_ = r->next;
  } else {
    pool_.emplace_back();
    r = &pool_.back();
  }
  std::memset(&r->fi_ctx, 0, sizeof(r->fi_ctx));
  r->state = Request::State::kPending;
  r->orphan = false;
  r->control = false;
  r->what = "";
  r->peer = -1;
  r->is_send = false;
  r->tagged = true;
  r->bytes = 0;
  r->got = 0;
  r->error.clear();
  r->prev = r->next = nullptr;
  return r;
}

void Engine::release(Request* r) {
  r->state = Request::State::kFree;
  r->prev = nullptr;
  r->next = free_;
  free_ = r;
}

bool Engine::own_region_free() {
  if (mark_ == nullptr) return true;
  if (wedged_.load(std::memory_order_relaxed)) return false;
  // A live sender is inside a send for a few hundred nanoseconds (it is
  // delivering what this rank is probably waiting for): wait that long.
  for (Backoff spin(kGateWait);; spin.wait()) {
    if (mark_->inbox() == 0) {
      inbox_busy_since_ = Clock::time_point{};
      return true;
    }
    if (!spin.spinning()) break;
  }
  // Note [Wedged endpoint]: a sender is inside a send to this rank. Live
  // ones leave within microseconds; one that stays while a same-host peer
  // died may have died there, holding this rank's lock.
  auto now = Clock::now();
  if (inbox_busy_since_ == Clock::time_point{}) {
    inbox_busy_since_ = now;
    next_wedge_scan_ = now + kInboxWedgeAfter;
  } else if (now >= next_wedge_scan_) {
    next_wedge_scan_ = now + std::chrono::milliseconds(5);  // thorough checks read /proc
    for (size_t w = 0; w < peers_.size(); ++w) {
      if (peers_[w].watched() && peer_gone(static_cast<int>(w), true)) {
        wedge(static_cast<int>(w));
        break;
      }
    }
  }
  return false;
}

void Engine::wedge(int world) {
  if (wedged_.exchange(true)) return;
  const std::string reason = fmt::format(
      "{} while sending to world rank {}, and left this rank's shared-memory endpoint locked: it cannot make "
      "progress any more (a limitation of the libfabric shm provider)",
      describe_gone(world), world_rank_);
  TORUS_LOG_ERROR("ofi: {}", reason);
  std::vector<std::shared_ptr<GroupState>> all;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    all = registered_;
  }
  for (auto& g : groups_) {
    if (std::find(all.begin(), all.end(), g) == all.end()) all.push_back(g);
  }
  for (auto& g : all) {
    if (g->set_broken(reason)) announce(*g, reason, world);
  }
}

bool Engine::drain_cq() {
  // Progress and receive posts take this rank's own region lock (Note
  // [Dead local peers]).
  if (!own_region_free()) return false;
  while (!control_reposts_.empty()) {
    size_t i = control_reposts_.back();
    control_reposts_.pop_back();
    repost_control(i);
  }
  fi_cq_tagged_entry entries[kCqBatch];
  CqError error;
  int n = fabric_->poll(entries, kCqBatch, &error);
  if (n == 0) return false;
  auto settle = [this](Request* r, const std::string* failure) {
    if (!r->control) --posted_requests_;
    if (r->control) {
      if (failure) r->error = *failure;
      r->state = failure ? Request::State::kFailed : Request::State::kDone;
      handle_control(r);
      return;
    }
    if (r->orphan) {
      release(r);
      return;
    }
    if (failure) {
      r->error = *failure;
      r->state = Request::State::kFailed;
    } else {
      r->state = Request::State::kDone;
    }
  };
  if (n > 0) {
    for (int i = 0; i < n; ++i) {
      auto* r = static_cast<Request*>(entries[i].op_context);
      r->got = entries[i].len;
      settle(r, nullptr);
    }
    return true;
  }
  if (error.context == nullptr) {
    TORUS_LOG_WARN("ofi: error completion without a context: {}", error.message);
    return true;
  }
  settle(static_cast<Request*>(error.context), &error.message);
  return true;
}

long Engine::try_post(Request* r) {
  const PeerProcess* p = r->is_send && r->peer >= 0 && static_cast<size_t>(r->peer) < peers_.size()
                             ? &peers_[static_cast<size_t>(r->peer)]
                             : nullptr;
  // A send to a guarded same-host peer (Note [Dead local peers]) first
  // counts itself in the receiver's inbox, which keeps the receiver from
  // entering the provider again, then waits for it to leave the provider
  // call it may be in (holding its own region lock): a few hundred
  // nanoseconds for a live one. Else it is deferred like a full queue
  // (gate() refuses it later if the receiver died in there).
  InInbox inbox(p != nullptr ? p->inbox() : nullptr);
  if (p != nullptr && p->inbox() != nullptr) {
    for (Backoff spin(kGateWait);; spin.wait()) {
      const PeerProcess::State s = p->provider_state();
      if (s == PeerProcess::State::kOutside) break;
      if (s == PeerProcess::State::kDiedInside || !spin.spinning()) return -FI_EAGAIN;
    }
  }
  InProvider in(mark_.get());
  if (!r->tagged) {
    return r->is_send ? fabric_->send(r->buf, r->bytes, r->desc, r->addr, &r->fi_ctx)
                      : fabric_->recv(r->buf, r->bytes, r->desc, &r->fi_ctx);
  }
  return r->is_send ? fabric_->tsend(r->buf, r->bytes, r->desc, r->addr, r->tag, &r->fi_ctx)
                    : fabric_->trecv(r->buf, r->bytes, r->desc, FI_ADDR_UNSPEC, r->tag, 0, &r->fi_ctx);
}

void Engine::refuse(Request* r) {
  r->state = Request::State::kFailed;
  r->error = describe_gone(r->peer) + "; nothing more is sent to it";
}

Engine::Gate Engine::gate(const Request* r) {
  if (!r->is_send) return own_region_free() ? Gate::kPost : Gate::kDefer;
  if (r->peer < 0 || static_cast<size_t>(r->peer) >= peers_.size()) return Gate::kPost;
  if (peer_gone(r->peer)) return Gate::kRefuse;
  // Another sender inside a send to the receiver may hold its region lock
  // (perhaps one that died there: the receiver is then wedged). Live ones
  // leave within a few hundred nanoseconds; try_post() does the rest.
  const PeerProcess& p = peers_[static_cast<size_t>(r->peer)];
  if (p.inbox() == nullptr) return Gate::kPost;
  for (Backoff spin(kGateWait);; spin.wait()) {
    if (__atomic_load_n(p.inbox(), __ATOMIC_SEQ_CST) == 0) return Gate::kPost;
    if (!spin.spinning()) return Gate::kDefer;
  }
}

void Engine::post(Request* r) {
  const Gate g = gate(r);  // Note [Never send to the dead]
  if (g == Gate::kRefuse) {
    refuse(r);
    return;
  }
  std::deque<Request*>& q = r->is_send ? unposted_sends_[r->addr] : unposted_recvs_;
  if (q.empty() && g == Gate::kPost && try_post(r) == 0) {
    r->state = Request::State::kPending;
    if (!r->control) ++posted_requests_;
    return;
  }
  r->state = Request::State::kQueued;
  q.push_back(r);
  ++unposted_;
}

bool Engine::retry_posts() {
  bool progress = false;
  auto drain = [&](std::deque<Request*>& q) {
    while (!q.empty()) {
      Request* r = q.front();
      if (r->orphan && !r->control) {
        q.pop_front();
        --unposted_;
        release(r);
        continue;
      }
      const Gate g = gate(r);  // Note [Never send to the dead]
      if (g == Gate::kRefuse) {
        q.pop_front();
        --unposted_;
        refuse(r);
        progress = true;
        if (r->control) handle_control(r);
        continue;
      }
      if (g == Gate::kDefer) break;  // its peer is inside the provider: later
      long rc;
      try {
        rc = try_post(r);
      } catch (const std::exception& e) {
        rc = 0;
        r->error = e.what();
        r->state = Request::State::kFailed;
        q.pop_front();
        --unposted_;
        progress = true;
        if (r->control) handle_control(r);
        continue;
      }
      if (rc != 0) break;  // still full
      q.pop_front();
      --unposted_;
      r->state = Request::State::kPending;
      if (!r->control) ++posted_requests_;
      progress = true;
    }
  };
  drain(unposted_recvs_);
  for (auto& [addr, q] : unposted_sends_) drain(q);
  return progress;
}

// --- control messages: tell peers that a group broke ---------------------------------

void Engine::post_control_recvs() {
  for (int i = 0; i < kControlRecvs; ++i) {
    control_bufs_.emplace_back(sizeof(ControlMessage));
    if (fabric_->needs_local_mr()) {
      control_mrs_.push_back(fabric_->register_memory(control_bufs_.back().data(), sizeof(ControlMessage),
                                                      FI_RECV | FI_SEND));
    }
    Request* r = new_request();
    r->control = true;
    r->what = "control recv";
    control_reqs_.push_back(r);
    void* desc = control_mrs_.empty() ? nullptr : control_mrs_.back().desc();
    TORUS_CHECK_OFI(fabric_->recv(control_bufs_.back().data(), sizeof(ControlMessage), desc, &r->fi_ctx),
                    "posting a control receive");
  }
}

void Engine::handle_control(Request* r) {
  auto it = std::find(control_reqs_.begin(), control_reqs_.end(), r);
  if (it == control_reqs_.end()) {  // a notice we sent
    --control_sends_;
    release(r);
    return;
  }
  size_t i = static_cast<size_t>(it - control_reqs_.begin());
  bool cancelled = r->state == Request::State::kFailed && r->error.find("Canceled") != std::string::npos;
  if (r->state == Request::State::kDone) {
    ControlMessage m;
    std::memcpy(&m, control_bufs_[i].data(), sizeof(m));
    m.reason[sizeof(m.reason) - 1] = '\0';
    if (m.magic == kControlMagic) {
      hard_failure_ = true;  // only hard failures are announced (Note [Failure])
      // The sender found a peer gone that may be on this host too: never
      // send to it again (Note [Never send to the dead]).
      if (m.gone_world != world_rank_ && local_pid(m.gone_world) > 0) {  // in range and on this host
        gone_[static_cast<size_t>(m.gone_world)].store(true, std::memory_order_release);
      }
      for (auto& g : groups_) {
        if (g->context != m.context) continue;
        const std::string why =
            fmt::format("rank {} (world rank {}) aborted group '{}': {}", m.from_rank, m.from_world, g->name, m.reason);
        if (g->set_broken(why)) {
          TORUS_LOG_WARN("ofi: group '{}' aborted by rank {}: {}", g->name, m.from_rank, m.reason);
          // Pass the cause on to this host's members waiting in shared
          // memory: a peer that fails and exits now must not leave them to
          // find only its own exit (they would name it, not the cause).
          if (g->on_announce) g->on_announce(why);
        }
      }
    }
  }
  if (cancelled) return;
  if (!own_region_free()) {
    control_reposts_.push_back(i);
    return;
  }
  repost_control(i);
}

void Engine::repost_control(size_t i) {
  Request* r = control_reqs_[i];
  std::memset(&r->fi_ctx, 0, sizeof(r->fi_ctx));
  r->state = Request::State::kPending;
  void* desc = control_mrs_.empty() ? nullptr : control_mrs_[i].desc();
  long rc = fabric_->recv(control_bufs_[i].data(), sizeof(ControlMessage), desc, &r->fi_ctx);
  if (rc != 0) TORUS_LOG_WARN("ofi: could not repost a control receive: {}", ofi_error_string(rc));
}

void Engine::announce(GroupState& g, const std::string& reason, int skip) {
  if (g.on_announce) g.on_announce(reason);
  // Peers that are gone get nothing (Note [Never send to the dead]), nor
  // does the peer whose link just failed: it is likely dying, and a notice
  // to it could hang this rank.
  std::vector<bool> send_to(g.member_world.size(), false);
  int gone = -1;
  for (size_t peer = 0; peer < g.member_world.size(); ++peer) {
    const int w = g.member_world[peer];
    if (static_cast<int>(peer) == g.rank) continue;
    if (peer_gone(w, true)) {
      if (gone < 0) gone = w;
      continue;
    }
    send_to[peer] = w != skip;
  }
  auto& m = notice_bufs_.emplace_back(sizeof(ControlMessage));
  ControlMessage msg;
  msg.context = g.context;
  msg.from_rank = g.rank;
  msg.from_world = world_rank_;
  msg.gone_world = gone;
  std::snprintf(msg.reason, sizeof(msg.reason), "%s", reason.c_str());
  std::memcpy(m.data(), &msg, sizeof(msg));
  void* desc = nullptr;
  if (fabric_->needs_local_mr()) {
    control_mrs_.push_back(fabric_->register_memory(m.data(), m.size(), FI_SEND));
    desc = control_mrs_.back().desc();
  }
  for (size_t peer = 0; peer < g.member_addr.size(); ++peer) {
    if (!send_to[peer]) continue;
    Request* r = new_request();
    r->control = true;
    r->what = "control send";
    r->peer = g.member_world[peer];
    r->is_send = true;
    r->tagged = false;
    r->buf = m.data();
    r->bytes = m.size();
    r->desc = desc;
    r->addr = g.member_addr[peer];
    try {
      post(r);
      if (r->state == Request::State::kFailed) {  // refused: gone after all
        release(r);
        continue;
      }
      ++control_sends_;
    } catch (const std::exception& e) {
      TORUS_LOG_DEBUG("ofi: abort notice to world rank {} not sent: {}", r->peer, e.what());
      release(r);  // best effort
    }
  }
}

}  // namespace torus::comm::ofi
