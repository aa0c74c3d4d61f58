// The schedule validator and simulator: runs every rank of a schedule under
// Note [Communication semantics] (schedule.h) with per-action costs, reports
// each problem with its rank and action, and measures the bubble and the
// live activations. Also the closed-form bubbles of the generated kinds.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/log.h"
#include "torus/parallel/pipeline/schedule.h"

namespace torus::pp {

namespace {

// What has happened to one (micro, chunk) on its rank.
enum Flag : uint16_t {
  kForwardDone = 1 << 0,
  kInputReceived = 1 << 1,
  kGradReceived = 1 << 2,
  kInputGradDone = 1 << 3,
  kWeightGradDone = 1 << 4,
  kFusedDone = 1 << 5,
  kActivationSent = 1 << 6,
  kGradSent = 1 << 7,
};

struct Message {
  int send_rank = -1;
  int send_index = -1;
  double arrival = 0;
  bool received = false;
};

class Simulator {
 public:
  // Costs from `model`, or — when `durations` is given — per action, with
  // `model.comm` as the message time either way.
  Simulator(const Schedule& s, const CostModel& model, const std::vector<std::vector<double>>* durations)
      : s_(s), c_(model), durations_(durations) {}

  Simulation run() {
    if (!check_static()) return std::move(out_);
    const int p = s_.num_ranks;
    const int mv = s_.num_micro * s_.num_chunks;
    flags_.assign(p, std::vector<uint16_t>(mv, 0));
    messages_.assign(size_t{2} * s_.num_micro * std::max(s_.num_stages() - 1, 1), Message{});
    pc_.assign(p, 0);
    time_.assign(p, 0.0);
    live_.assign(p, 0);
    failed_.assign(p, false);
    out_.ranks.assign(p, RankStats{});
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p; ++r) {
        while (!failed_[r] && pc_[r] < actions(r)) {
          Step st = step(r);
          if (st != Step::kDone) break;
          ++pc_[r];
          progress = true;
        }
      }
    }
    if (!out_.issues.empty()) return std::move(out_);  // later ranks may be blocked behind the errors
    if (report_deadlock()) return std::move(out_);
    report_unreceived();
    report_incomplete();
    for (int r = 0; r < p; ++r) {
      out_.ranks[r].finish = time_[r];
      out_.makespan = std::max(out_.makespan, time_[r]);
    }
    for (auto& rs : out_.ranks) rs.bubble = out_.makespan > 0 ? (out_.makespan - rs.busy) / out_.makespan : 0.0;
    return std::move(out_);
  }

 private:
  enum class Step { kDone, kBlocked, kError };

  int actions(int r) const { return static_cast<int>(s_.actions[r].size()); }

  void issue(int r, int i, std::string why) {
    std::string where =
        r < 0 ? std::string() : fmt::format("rank {}, action #{} {}: ", r, i, s_.actions[r][i].describe());
    out_.issues.push_back({r, i, where + why});
  }

  // The link a communication action uses (edge e joins stages e and e+1).
  int edge_of(int r, const Action& a) const {
    const int stage = s_.stage(r, a.chunk);
    return (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad) ? stage : stage - 1;
  }
  static bool carries_grad(ActionKind k) { return k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad; }
  Message& message(int r, const Action& a) {
    const int edges = std::max(s_.num_stages() - 1, 1);
    return messages_[(size_t{carries_grad(a.kind)} * s_.num_micro + a.micro) * edges + edge_of(r, a)];
  }

  // Ranges, peers and which stage may communicate in which direction: all
  // checks that do not depend on the order of execution.
  bool check_static() {
    const int p = s_.num_ranks, m = s_.num_micro, v = s_.num_chunks;
    TORUS_CHECK(p >= 1 && m >= 1 && v >= 1, InvalidArgument, "{}: needs at least one rank, micro-batch and chunk",
                s_.describe());
    TORUS_CHECK(static_cast<int>(s_.actions.size()) == p, InvalidArgument, "{}: holds action lists for {} ranks",
                s_.describe(), s_.actions.size());
    TORUS_CHECK(c_.forward >= 0 && c_.backward_input >= 0 && c_.backward_weight >= 0 && c_.comm >= 0, InvalidArgument,
                "pipeline cost model: costs must be >= 0");
    if (durations_ != nullptr) {
      TORUS_CHECK(static_cast<int>(durations_->size()) == p, InvalidArgument,
                  "simulate: durations for {} ranks, {} has {}", durations_->size(), s_.describe(), p);
      for (int r = 0; r < p; ++r) {
        const auto& d = (*durations_)[r];
        TORUS_CHECK(d.size() == s_.actions[r].size(), InvalidArgument,
                    "simulate: {} durations for rank {}, which has {} actions", d.size(), r, s_.actions[r].size());
        TORUS_CHECK(std::all_of(d.begin(), d.end(), [](double x) { return x >= 0; }), InvalidArgument,
                    "simulate: durations of rank {} must be >= 0", r);
      }
    }
    if (v > 1 && p == 1) {
      out_.issues.push_back({-1, -1,
                             fmt::format("{}: {} chunks on a single rank would send to itself; "
                                         "more than one chunk needs at least 2 ranks",
                                         s_.describe(), v)});
      return false;
    }
    for (int r = 0; r < p; ++r) {
      for (int i = 0; i < actions(r); ++i) {
        const Action& a = s_.actions[r][i];
        if (a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= v) {
          issue(r, i, fmt::format("micro-batch must be in [0, {}) and chunk in [0, {})", m, v));
          continue;
        }
        if (is_compute(a.kind)) {
          if (a.peer != -1) issue(r, i, "a compute action has no peer (set peer = -1)");
          continue;
        }
        const int stage = s_.stage(r, a.chunk);
        const bool towards_next = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad;
        if (towards_next && stage == s_.num_stages() - 1) {
          issue(r, i, fmt::format("stage {} is the last stage; it has no next stage to talk to", stage));
          continue;
        }
        if (!towards_next && stage == 0) {
          issue(r, i, "stage 0 is the first stage; it has no previous stage to talk to");
          continue;
        }
        const int other = towards_next ? stage + 1 : stage - 1;
        if (a.peer != s_.rank_of_stage(other)) {
          issue(r, i,
                fmt::format("mismatched peer: the {} stage {} lives on rank {}, not rank {}",
                            towards_next ? "next" : "previous", other, s_.rank_of_stage(other), a.peer));
        }
      }
    }
    return out_.issues.empty();
  }

  Step fail(int r, std::string why) {
    issue(r, pc_[r], std::move(why));
    failed_[r] = true;
    return Step::kError;
  }

  // `cost`: the model's cost of one micro-batch through the whole rank.
  void run_compute(int r, double cost) {
    const double t = durations_ != nullptr ? (*durations_)[r][pc_[r]] : cost / s_.num_chunks;
    time_[r] += t;
    out_.ranks[r].busy += t;
  }

  Step step(int r) {
    const Action& a = s_.actions[r][pc_[r]];
    uint16_t& f = flags_[r][a.micro * s_.num_chunks + a.chunk];
    const bool first = s_.is_first_stage(r, a.chunk);
    const bool last = s_.is_last_stage(r, a.chunk);
    switch (a.kind) {
      case ActionKind::kForward:
        if (f & kForwardDone) return fail(r, "runs a second time");
        if (!first && !(f & kInputReceived)) {
          return fail(r, "runs before its input was received (no RecvActivation of it earlier on this rank)");
        }
        run_compute(r, c_.forward);
        f |= kForwardDone;
        out_.ranks[r].peak_live = std::max(out_.ranks[r].peak_live, ++live_[r]);
        return Step::kDone;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (s_.forward_only) return fail(r, "is a backward in a forward-only schedule");
        if (f & (kInputGradDone | kFusedDone)) return fail(r, "runs a second backward of this micro-batch and chunk");
        if (!(f & kForwardDone)) return fail(r, "is a backward before its forward");
        if (!last && !(f & kGradReceived)) {
          return fail(r, "runs before its output gradient was received (no RecvGrad of it earlier on this rank)");
        }
        if (a.kind == ActionKind::kBackward) {
          run_compute(r, c_.backward_input + c_.backward_weight);
          f |= kFusedDone;
          --live_[r];
        } else {
          run_compute(r, c_.backward_input);
          f |= kInputGradDone;
        }
        return Step::kDone;
      case ActionKind::kBackwardWeight:
        if (f & kWeightGradDone) return fail(r, "runs a second time");
        if (f & kFusedDone) return fail(r, "follows a fused Backward, which computed the weight gradient already");
        if (!(f & kInputGradDone)) return fail(r, "runs before the BackwardInput of this micro-batch and chunk");
        run_compute(r, c_.backward_weight);
        f |= kWeightGradDone;
        --live_[r];
        return Step::kDone;
      case ActionKind::kSendActivation:
      case ActionKind::kSendGrad: {
        const bool grad = a.kind == ActionKind::kSendGrad;
        if (f & (grad ? kGradSent : kActivationSent)) return fail(r, "sends the same message a second time");
        if (!grad && !(f & kForwardDone)) return fail(r, "sends an activation its Forward has not computed yet");
        if (grad && !(f & (kInputGradDone | kFusedDone))) {
          return fail(r, "sends an input gradient its backward has not computed yet");
        }
        Message& msg = message(r, a);
        msg.send_rank = r;
        msg.send_index = pc_[r];
        msg.arrival = time_[r] + c_.comm;
        f |= grad ? kGradSent : kActivationSent;
        return Step::kDone;
      }
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        const uint16_t flag = a.kind == ActionKind::kRecvGrad ? kGradReceived : kInputReceived;
        if (f & flag) return fail(r, "receives the same message a second time");
        Message& msg = message(r, a);
        if (msg.send_rank < 0) return Step::kBlocked;
        time_[r] = std::max(time_[r], msg.arrival);
        msg.received = true;
        f |= flag;
        return Step::kDone;
      }
    }
    return fail(r, "has an unknown kind");
  }

  // The send that would satisfy the receive `a` of rank r, searched in the
  // peer's list from position `from`; -1 if there is none.
  int matching_send(int r, const Action& a, int from) const {
    const ActionKind want = a.kind == ActionKind::kRecvGrad ? ActionKind::kSendGrad : ActionKind::kSendActivation;
    const int q = a.peer;
    const int edge = edge_of(r, a);
    for (int j = from; j < actions(q); ++j) {
      const Action& b = s_.actions[q][j];
      if (b.kind == want && b.micro == a.micro && edge_of(q, b) == edge) return j;
    }
    return -1;
  }

  bool report_deadlock() {
    const int p = s_.num_ranks;
    std::vector<int> blocked;
    for (int r = 0; r < p; ++r) {
      if (pc_[r] < actions(r)) blocked.push_back(r);
    }
    if (blocked.empty()) return false;
    // The wait-for graph: each blocked rank waits in a receive from its peer.
    std::string cycle;
    {
      std::vector<int> seen(p, -1);
      int r = blocked.front();
      for (int hop = 0; pc_[r] < actions(r) && seen[r] < 0; ++hop) {
        seen[r] = hop;
        r = s_.actions[r][pc_[r]].peer;
      }
      if (pc_[r] < actions(r)) {  // came back to a rank on the path
        const int start = r;
        cycle = fmt::format("wait cycle: rank {}", start);
        do {
          r = s_.actions[r][pc_[r]].peer;
          cycle += fmt::format(" -> rank {}", r);
        } while (r != start);
      } else {
        cycle = fmt::format("rank {} waits for a message that is never sent", blocked.front());
      }
    }
    out_.issues.push_back({blocked.front(), pc_[blocked.front()],
                           fmt::format("deadlock: {} of {} ranks never finish; {}", blocked.size(), p, cycle)});
    for (int r : blocked) {
      const Action& a = s_.actions[r][pc_[r]];
      const int q = a.peer;
      std::string why;
      const int j = matching_send(r, a, 0);
      if (j < 0) {
        why = fmt::format("rank {} never sends it", q);
      } else if (pc_[q] < actions(q)) {
        why = fmt::format("rank {} sends it only at action #{}, but is itself blocked at action #{} {}", q, j, pc_[q],
                          s_.actions[q][pc_[q]].describe());
      } else {
        why = fmt::format("rank {} sends it at action #{}", q, j);  // unreachable under these semantics
      }
      issue(r, pc_[r], "blocks forever: " + why);
    }
    return true;
  }

  void report_unreceived() {
    for (const Message& msg : messages_) {
      if (msg.send_rank < 0 || msg.received) continue;
      const Action& a = s_.actions[msg.send_rank][msg.send_index];
      issue(msg.send_rank, msg.send_index,
            fmt::format("the message is never received: rank {} has no matching {}", a.peer,
                        a.kind == ActionKind::kSendGrad ? "RecvGrad" : "RecvActivation"));
    }
  }

  void report_incomplete() {
    for (int r = 0; r < s_.num_ranks; ++r) {
      for (int mb = 0; mb < s_.num_micro; ++mb) {
        for (int c = 0; c < s_.num_chunks; ++c) {
          const uint16_t f = flags_[r][mb * s_.num_chunks + c];
          const std::string what = fmt::format("rank {} (stage {}) never runs", r, s_.stage(r, c));
          if (!(f & kForwardDone)) {
            out_.issues.push_back({r, -1, fmt::format("{} the Forward of micro-batch {}, chunk {}", what, mb, c)});
          } else if (s_.forward_only) {
            continue;
          } else if (f & kInputGradDone && !(f & kWeightGradDone)) {
            out_.issues.push_back(
                {r, -1, fmt::format("{} the BackwardWeight of micro-batch {}, chunk {}", what, mb, c)});
          } else if (!(f & (kInputGradDone | kFusedDone))) {
            out_.issues.push_back({r, -1, fmt::format("{} the backward of micro-batch {}, chunk {}", what, mb, c)});
          }
        }
      }
    }
  }

  const Schedule& s_;
  const CostModel& c_;
  const std::vector<std::vector<double>>* durations_;
  Simulation out_;
  std::vector<std::vector<uint16_t>> flags_;  // [rank][micro * v + chunk]
  std::vector<Message> messages_;             // [(grad * m + micro) * edges + edge]
  std::vector<int> pc_;                       // next action per rank
  std::vector<double> time_;
  std::vector<int> live_;
  std::vector<bool> failed_;
};

}  // namespace

double Simulation::bubble() const {
  if (ranks.empty()) return 0.0;
  double sum = 0;
  for (const auto& r : ranks) sum += r.bubble;
  return sum / static_cast<double>(ranks.size());
}

int Simulation::peak_live() const {
  int peak = 0;
  for (const auto& r : ranks) peak = std::max(peak, r.peak_live);
  return peak;
}

Simulation simulate(const Schedule& schedule, const CostModel& costs) {
  return Simulator(schedule, costs, nullptr).run();
}

Simulation simulate(const Schedule& schedule, const std::vector<std::vector<double>>& durations, double comm) {
  const CostModel model{0, 0, 0, comm};
  return Simulator(schedule, model, &durations).run();
}

std::vector<ScheduleIssue> validate(const Schedule& schedule) {
  return simulate(schedule).issues;
}

void check_schedule(const Schedule& schedule) {
  auto issues = validate(schedule);
  if (issues.empty()) return;
  constexpr size_t kShown = 8;
  std::string msg =
      fmt::format("{} is invalid ({} problem{}):", schedule.describe(), issues.size(), issues.size() == 1 ? "" : "s");
  for (size_t i = 0; i < std::min(issues.size(), kShown); ++i) msg += "\n  " + issues[i].message;
  if (issues.size() > kShown) msg += fmt::format("\n  ... and {} more", issues.size() - kShown);
  throw InvalidArgument(msg);
}

double closed_form_bubble(ScheduleKind kind, int p, int m, int v, const CostModel& c) {
  TORUS_CHECK(p >= 1 && m >= 1 && v >= 1, InvalidArgument, "closed_form_bubble: p, m, v must be >= 1");
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      return double(p - 1) / double(m + p - 1);
    case ScheduleKind::kInterleaved1F1B:
      return double(p - 1) / double(v * m + p - 1);
    case ScheduleKind::kZeroBubbleH1: {
      const double idle = (p - 1) * (c.forward + c.backward_input - c.backward_weight);
      const double work = m * (c.forward + c.backward_input + c.backward_weight);
      return idle + work > 0 ? idle / (idle + work) : 0.0;
    }
  }
  return 0.0;
}

}  // namespace torus::pp
