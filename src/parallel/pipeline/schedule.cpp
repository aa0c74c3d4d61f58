// Schedules as data: action names and text forms, the generators (GPipe,
// 1F1B, interleaved 1F1B, ZB-H1) and the insertion of communication actions.
// The validator and simulator live in simulate.cpp. Contracts in
// include/torus/parallel/pipeline/schedule.h.
#include "torus/parallel/pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/log.h"

namespace torus::pp {

namespace {

struct KindInfo {
  ActionKind kind;
  std::string_view code;
  std::string_view name;
};
// Longest codes first so that parsing "BI3" never stops at "B".
constexpr KindInfo kKinds[] = {
    {ActionKind::kBackwardInput, "BI", "BackwardInput"},
    {ActionKind::kBackwardWeight, "BW", "BackwardWeight"},
    {ActionKind::kSendActivation, "SA", "SendActivation"},
    {ActionKind::kRecvActivation, "RA", "RecvActivation"},
    {ActionKind::kSendGrad, "SG", "SendGrad"},
    {ActionKind::kRecvGrad, "RG", "RecvGrad"},
    {ActionKind::kForward, "F", "Forward"},
    {ActionKind::kBackward, "B", "Backward"},
};

const KindInfo& info(ActionKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k;
  }
  throw InvalidArgument(fmt::format("unknown pipeline action kind {}", static_cast<int>(kind)));
}

void check_sizes(std::string_view what, int p, int m, int v) {
  TORUS_CHECK(p >= 1 && m >= 1 && v >= 1, InvalidArgument,
              "{}: needs at least one rank, micro-batch and chunk, got p={}, m={}, v={}", what, p, m, v);
}

Schedule empty_schedule(std::string name, int p, int m, int v) {
  Schedule s;
  s.name = std::move(name);
  s.num_ranks = p;
  s.num_micro = m;
  s.num_chunks = v;
  s.actions.resize(p);
  return s;
}

Action compute(ActionKind kind, int micro, int chunk = 0) {
  return Action{kind, micro, chunk, -1};
}

// The compute order of 1F1B on rank r, with the backward either fused or
// split into input and weight parts; `weight_delay` weight-gradients are
// held back (ZB-H1) and run at the end.
std::vector<Action> one_f_one_b_rank(int p, int m, int r, bool split, int weight_delay) {
  std::vector<Action> out;
  const int warmup = std::min(p - 1 - r, m);
  int next_forward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back(compute(ActionKind::kForward, next_forward));
  int next_weight = 0;
  for (int b = 0; b < m; ++b) {
    if (next_forward < m) out.push_back(compute(ActionKind::kForward, next_forward++));
    if (!split) {
      out.push_back(compute(ActionKind::kBackward, b));
      continue;
    }
    out.push_back(compute(ActionKind::kBackwardInput, b));
    if (b >= weight_delay) out.push_back(compute(ActionKind::kBackwardWeight, next_weight++));
  }
  while (split && next_weight < m) out.push_back(compute(ActionKind::kBackwardWeight, next_weight++));
  return out;
}

bool parse_int(std::string_view text, int& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}

}  // namespace

std::string_view action_kind_code(ActionKind kind) {
  return info(kind).code;
}
std::string_view action_kind_name(ActionKind kind) {
  return info(kind).name;
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight ||
         kind == ActionKind::kBackward;
}
bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGrad;
}
bool is_recv(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGrad;
}

std::string Action::describe() const {
  std::string s = fmt::format("{}(micro {}, chunk {}", action_kind_name(kind), micro, chunk);
  if (is_send(kind)) s += fmt::format(", to rank {}", peer);
  if (is_recv(kind)) s += fmt::format(", from rank {}", peer);
  return s + ")";
}

std::string Action::token() const {
  std::string s = fmt::format("{}{}", action_kind_code(kind), micro);
  if (chunk != 0) s += fmt::format(".{}", chunk);
  if (peer >= 0) s += fmt::format("@{}", peer);
  return s;
}

std::string Schedule::describe() const {
  return fmt::format("schedule '{}' (p={}, m={}, v={})", name, num_ranks, num_micro, num_chunks);
}

std::string Schedule::to_string() const {
  std::string out;
  for (size_t r = 0; r < actions.size(); ++r) {
    out += fmt::format("rank {}:", r);
    for (const Action& a : actions[r]) out += " " + a.token();
    out += "\n";
  }
  return out;
}

// ---- kinds ------------------------------------------------------------------------

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
  }
  return "?";
}

ScheduleKind schedule_kind_from_name(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "gpipe") return ScheduleKind::kGPipe;
  if (n == "1f1b") return ScheduleKind::k1F1B;
  if (n == "interleaved" || n == "interleaved-1f1b" || n == "interleaved_1f1b") {
    return ScheduleKind::kInterleaved1F1B;
  }
  if (n == "zb-h1" || n == "zbh1" || n == "zb_h1" || n == "zero-bubble") return ScheduleKind::kZeroBubbleH1;
  throw InvalidArgument(
      fmt::format("unknown pipeline schedule '{}'; expected gpipe, 1f1b, interleaved or zb-h1", name));
}

// ---- generators --------------------------------------------------------------------

Schedule make_schedule(const ScheduleOptions& o) {
  TORUS_CHECK(o.kind == ScheduleKind::kInterleaved1F1B || o.num_chunks == 1, InvalidArgument,
              "pipeline schedule '{}' has one chunk per rank, got num_chunks={} (only 'interleaved' takes more)",
              schedule_kind_name(o.kind), o.num_chunks);
  switch (o.kind) {
    case ScheduleKind::kGPipe:
      return gpipe(o.num_ranks, o.num_micro);
    case ScheduleKind::k1F1B:
      return one_f_one_b(o.num_ranks, o.num_micro);
    case ScheduleKind::kInterleaved1F1B:
      return interleaved_1f1b(o.num_ranks, o.num_micro, o.num_chunks);
    case ScheduleKind::kZeroBubbleH1:
      return zero_bubble_h1(o.num_ranks, o.num_micro);
  }
  throw InvalidArgument("unknown pipeline schedule kind");
}

Schedule gpipe(int p, int m) {
  check_sizes("gpipe", p, m, 1);
  Schedule s = empty_schedule("gpipe", p, m, 1);
  for (auto& rank : s.actions) {
    for (int i = 0; i < m; ++i) rank.push_back(compute(ActionKind::kForward, i));
    for (int i = 0; i < m; ++i) rank.push_back(compute(ActionKind::kBackward, i));
  }
  add_communication(s);
  return s;
}

Schedule forward_only(int p, int m, int v) {
  check_sizes("forward-only", p, m, v);
  Schedule s = empty_schedule("forward-only", p, m, v);
  s.forward_only = true;
  for (auto& rank : s.actions) {
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < v; ++c) rank.push_back(compute(ActionKind::kForward, i, c));
    }
  }
  add_communication(s);
  return s;
}

Schedule one_f_one_b(int p, int m) {
  check_sizes("1f1b", p, m, 1);
  Schedule s = empty_schedule("1f1b", p, m, 1);
  for (int r = 0; r < p; ++r) s.actions[r] = one_f_one_b_rank(p, m, r, /*split=*/false, 0);
  add_communication(s);
  return s;
}

Schedule zero_bubble_h1(int p, int m) {
  check_sizes("zb-h1", p, m, 1);
  Schedule s = empty_schedule("zb-h1", p, m, 1);
  // Rank r runs its last input-gradient about r*t_B before rank 0 does (the
  // gradient still has to travel down to rank 0), so it holds back r
  // weight-gradients to fill that tail. With p-1-r warm-up forwards this
  // keeps every rank at p live micro-batches, the peak of 1F1B.
  for (int r = 0; r < p; ++r) s.actions[r] = one_f_one_b_rank(p, m, r, /*split=*/true, r);
  add_communication(s);
  return s;
}

Schedule interleaved_1f1b(int p, int m, int v) {
  check_sizes("interleaved", p, m, v);
  TORUS_CHECK(v == 1 || p >= 2, InvalidArgument,
              "interleaved 1F1B with {} chunks per rank needs at least 2 pipeline ranks, got 1", v);
  TORUS_CHECK(v == 1 || m % p == 0, InvalidArgument,
              "interleaved 1F1B needs the number of micro-batches to be a multiple of the pipeline size "
              "(micro-batches advance through the chunks in groups of p), got m={} with p={}",
              m, p);
  Schedule s = empty_schedule("interleaved", p, m, v);
  const int total = m * v;
  // Virtual step k runs micro-batch (k / (p v)) p + k % p on chunk (k / p) % v
  // in the forward direction, and on chunk v-1-(k / p) % v for backwards.
  auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_chunk = [&](int k) { return (k / p) % v; };
  auto backward_chunk = [&](int k) { return v - 1 - (k / p) % v; };
  for (int r = 0; r < p; ++r) {
    // Megatron's warm-up: enough forwards for the first backward to arrive.
    const int warmup = m == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto& out = s.actions[r];
    for (int k = 0; k < warmup; ++k) out.push_back(compute(ActionKind::kForward, micro(k), forward_chunk(k)));
    for (int k = 0; k < total - warmup; ++k) {
      out.push_back(compute(ActionKind::kForward, micro(k + warmup), forward_chunk(k + warmup)));
      out.push_back(compute(ActionKind::kBackward, micro(k), backward_chunk(k)));
    }
    for (int k = std::max(total - warmup, 0); k < total; ++k) {
      out.push_back(compute(ActionKind::kBackward, micro(k), backward_chunk(k)));
    }
  }
  add_communication(s);
  return s;
}

void add_communication(Schedule& s) {
  TORUS_CHECK(static_cast<int>(s.actions.size()) == s.num_ranks, InvalidArgument, "{}: holds action lists for {} ranks",
              s.describe(), s.actions.size());
  const int p = s.num_ranks;
  for (int r = 0; r < p; ++r) {
    std::vector<Action> out;
    out.reserve(s.actions[r].size() * 2);
    for (const Action& a : s.actions[r]) {
      TORUS_CHECK(is_compute(a.kind), InvalidArgument,
                  "{}: add_communication expects compute actions only, rank {} holds {}", s.describe(), r,
                  a.describe());
      const int stage = s.stage(r, a.chunk);
      const bool first = stage == 0;
      const bool last = stage == s.num_stages() - 1;
      const int prev = (r + p - 1) % p;
      const int next = (r + 1) % p;
      if (a.kind == ActionKind::kForward && !first)
        out.push_back({ActionKind::kRecvActivation, a.micro, a.chunk, prev});
      const bool backward = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
      if (backward && !last) out.push_back({ActionKind::kRecvGrad, a.micro, a.chunk, next});
      out.push_back(a);
      if (a.kind == ActionKind::kForward && !last) out.push_back({ActionKind::kSendActivation, a.micro, a.chunk, next});
      if (backward && !first) out.push_back({ActionKind::kSendGrad, a.micro, a.chunk, prev});
    }
    s.actions[r] = std::move(out);
  }
}

Schedule parse_schedule(std::string name, int p, int m, int v, const std::vector<std::string>& ranks) {
  check_sizes("parse_schedule", p, m, v);
  TORUS_CHECK(static_cast<int>(ranks.size()) == p, InvalidArgument, "parse_schedule: {} lines for {} ranks",
              ranks.size(), p);
  Schedule s = empty_schedule(std::move(name), p, m, v);
  for (int r = 0; r < p; ++r) {
    std::string_view line = ranks[r];
    if (line.starts_with("rank")) {
      auto colon = line.find(':');
      TORUS_CHECK(colon != std::string_view::npos, InvalidArgument, "parse_schedule: rank {}: no ':' after 'rank'", r);
      line.remove_prefix(colon + 1);
    }
    size_t pos = 0;
    while (pos < line.size()) {
      while (pos < line.size() && std::isspace(static_cast<unsigned char>(line[pos]))) ++pos;
      size_t end = pos;
      while (end < line.size() && !std::isspace(static_cast<unsigned char>(line[end]))) ++end;
      if (end == pos) break;
      std::string_view tok = line.substr(pos, end - pos);
      pos = end;
      auto bad = [&](std::string_view why) {
        return InvalidArgument(fmt::format("parse_schedule: rank {}: cannot read '{}': {}", r, tok, why));
      };
      const KindInfo* kind = nullptr;
      for (const auto& k : kKinds) {
        if (tok.starts_with(k.code) && tok.size() > k.code.size() &&
            std::isdigit(static_cast<unsigned char>(tok[k.code.size()]))) {
          kind = &k;
          break;
        }
      }
      if (kind == nullptr) throw bad("expected F, B, BI, BW, SA, RA, SG or RG followed by a micro-batch");
      std::string_view rest = tok.substr(kind->code.size());
      Action a{kind->kind, 0, 0, -1};
      std::string_view peer_text, chunk_text;
      if (auto at = rest.find('@'); at != std::string_view::npos) {
        peer_text = rest.substr(at + 1);
        rest = rest.substr(0, at);
      }
      if (auto dot = rest.find('.'); dot != std::string_view::npos) {
        chunk_text = rest.substr(dot + 1);
        rest = rest.substr(0, dot);
      }
      if (!parse_int(rest, a.micro)) throw bad("bad micro-batch");
      if (!chunk_text.empty() && !parse_int(chunk_text, a.chunk)) throw bad("bad chunk");
      if (!peer_text.empty()) {
        if (is_compute(a.kind) || !parse_int(peer_text, a.peer)) {
          throw bad("bad peer (only communication actions take '@rank')");
        }
      } else if (!is_compute(a.kind)) {
        const bool towards_next = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad;
        a.peer = towards_next ? (r + 1) % p : (r + p - 1) % p;
      }
      s.actions[r].push_back(a);
    }
  }
  return s;
}

}  // namespace torus::pp
