// The engine's provider-facing side (engine.h): the request pool, posting
// with queueing when the provider is full, reading completions, and the
// control messages that announce a broken group to its peers.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "comm/ofi/engine.h"
#include "comm/ofi/ofi_check.h"

namespace torus::comm::ofi {
namespace {

constexpr uint32_t kControlMagic = 0x544f5231;  // "TOR1"
constexpr int kControlRecvs = 4;
constexpr int kCqBatch = 32;

// The abort notice a rank sends to its group's peers (Note [Failure]).
struct ControlMessage {
  uint32_t magic = kControlMagic;
  uint32_t context = 0;
  int32_t from_rank = -1;
  int32_t from_world = -1;
  char reason[240] = {};
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

bool Engine::drain_cq() {
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
  if (!r->tagged) {
    return r->is_send ? fabric_->send(r->buf, r->bytes, r->desc, r->addr, &r->fi_ctx)
                      : fabric_->recv(r->buf, r->bytes, r->desc, &r->fi_ctx);
  }
  return r->is_send ? fabric_->tsend(r->buf, r->bytes, r->desc, r->addr, r->tag, &r->fi_ctx)
                    : fabric_->trecv(r->buf, r->bytes, r->desc, FI_ADDR_UNSPEC, r->tag, 0, &r->fi_ctx);
}

void Engine::post(Request* r) {
  std::deque<Request*>& q = r->is_send ? unposted_sends_[r->addr] : unposted_recvs_;
  if (q.empty() && try_post(r) == 0) {
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
      for (auto& g : groups_) {
        if (g->context != m.context) continue;
        if (g->set_broken(fmt::format("rank {} (world rank {}) aborted group '{}': {}", m.from_rank, m.from_world,
                                      g->name, m.reason))) {
          TORUS_LOG_WARN("ofi: group '{}' aborted by rank {}: {}", g->name, m.from_rank, m.reason);
        }
      }
    }
  }
  if (cancelled) return;
  std::memset(&r->fi_ctx, 0, sizeof(r->fi_ctx));
  r->state = Request::State::kPending;
  void* desc = control_mrs_.empty() ? nullptr : control_mrs_[i].desc();
  long rc = fabric_->recv(control_bufs_[i].data(), sizeof(ControlMessage), desc, &r->fi_ctx);
  if (rc != 0) TORUS_LOG_WARN("ofi: could not repost a control receive: {}", ofi_error_string(rc));
}

void Engine::announce(GroupState& g, const std::string& reason) {
  if (g.on_announce) g.on_announce(reason);
  auto& m = notice_bufs_.emplace_back(sizeof(ControlMessage));
  ControlMessage msg;
  msg.context = g.context;
  msg.from_rank = g.rank;
  msg.from_world = world_rank_;
  std::snprintf(msg.reason, sizeof(msg.reason), "%s", reason.c_str());
  std::memcpy(m.data(), &msg, sizeof(msg));
  void* desc = nullptr;
  if (fabric_->needs_local_mr()) {
    control_mrs_.push_back(fabric_->register_memory(m.data(), m.size(), FI_SEND));
    desc = control_mrs_.back().desc();
  }
  for (size_t peer = 0; peer < g.member_addr.size(); ++peer) {
    if (static_cast<int>(peer) == g.rank) continue;
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
      ++control_sends_;
    } catch (const std::exception& e) {
      TORUS_LOG_DEBUG("ofi: abort notice to world rank {} not sent: {}", r->peer, e.what());
      release(r);  // best effort
    }
  }
}

}  // namespace torus::comm::ofi
