// The layout value and its field table (parallel/layout.h, Note [One layout]).
#include "torus/parallel/layout.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <sstream>
#include <type_traits>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus {
namespace dp {

std::string_view offload_name(Offload offload) {
  switch (offload) {
    case Offload::kNone: return "none";
    case Offload::kOptimizer: return "optimizer";
    case Offload::kOptimizerAndParams: return "optimizer+params";
  }
  return "?";
}

Offload parse_offload(std::string_view text) {
  for (Offload o : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
    if (text == offload_name(o)) return o;
  }
  throw InvalidArgument(fmt::format("--offload must be one of none, optimizer, optimizer+params, got '{}'", text));
}

void check_zero_stage(int stage, Offload offload) {
  TORUS_CHECK(stage >= 0 && stage <= 3, InvalidArgument, "--zero must be 0, 1, 2 or 3, got {}", stage);
  TORUS_CHECK(offload == Offload::kNone || stage >= 1, InvalidArgument,
              "--offload {} needs ZeRO: use it with --zero 1, 2 or 3 (got --zero {})", offload_name(offload), stage);
  TORUS_CHECK(offload != Offload::kOptimizerAndParams || stage == 3, InvalidArgument,
              "--offload optimizer+params offloads parameter shards: it needs --zero 3 (got --zero {})", stage);
}

}  // namespace dp

namespace parallel {
namespace {

using Json = nlohmann::ordered_json;
using Kind = LayoutField::Kind;

int parse_int(const std::string& name, const std::string& text) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, v);
  TORUS_CHECK(!text.empty() && r.ec == std::errc() && r.ptr == end, InvalidArgument,
              "--{}: '{}' is not an integer", name, text);
  return v;
}

bool parse_bool(const std::string& name, const std::string& text) {
  for (const char* t : {"true", "1", "yes", "on"}) {
    if (text == t) return true;
  }
  for (const char* f : {"false", "0", "no", "off"}) {
    if (text == f) return false;
  }
  throw InvalidArgument(fmt::format("--{}: '{}' is not a boolean (true or false)", name, text));
}

std::string join_counts(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::vector<int64_t> parse_counts(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t v = 0;
    auto r = std::from_chars(item.data(), item.data() + item.size(), v);
    TORUS_CHECK(r.ec == std::errc() && r.ptr == item.data() + item.size(), InvalidArgument,
                "--stage-layers: '{}' is not an integer (expected e.g. 3,1)", item);
    out.push_back(v);
  }
  return out;
}

// A field that is an int or bool member.
template <class T>
LayoutField member_field(std::string name, std::string help, T Layout::*member, bool placement) {
  LayoutField f;
  f.name = std::move(name);
  f.kind = std::is_same_v<T, bool> ? Kind::kBool : Kind::kInt;
  f.help = std::move(help);
  f.placement = placement;
  f.get = [member](const Layout& l) {
    if constexpr (std::is_same_v<T, bool>) {
      return std::string(l.*member ? "true" : "false");
    } else {
      return std::to_string(l.*member);
    }
  };
  f.set = [member, n = f.name](Layout& l, const std::string& t) {
    if constexpr (std::is_same_v<T, bool>) {
      l.*member = parse_bool(n, t);
    } else {
      l.*member = parse_int(n, t);
    }
  };
  return f;
}

LayoutField text_field(std::string name, std::string help, bool placement,
                       std::function<std::string(const Layout&)> get,
                       std::function<void(Layout&, const std::string&)> set) {
  LayoutField f;
  f.name = std::move(name);
  f.kind = Kind::kText;
  f.help = std::move(help);
  f.placement = placement;
  f.get = std::move(get);
  f.set = std::move(set);
  return f;
}

std::vector<LayoutField> make_fields() {
  std::vector<LayoutField> t;
  t.push_back(member_field("tp", "tensor-parallel size", &Layout::tp, true));
  t.push_back(member_field("pp", "pipeline-parallel size", &Layout::pp, true));
  t.push_back(member_field("dp", "data-parallel size (0: world / (tp x pp x ep))", &Layout::dp, true));
  t.push_back(member_field("ep", "expert-parallel size (MoE; the batch is split over dp x ep)", &Layout::ep, true));
  for (LayoutField& f : t) f.mesh = true;  // the four above
  t.push_back(member_field("sp", "sequence parallelism (with --tp > 1)", &Layout::sequence_parallel, true));
  t.push_back(member_field("expert-tp",
                         "MoE: split each expert's MLP over the --tp ranks instead of holding whole experts on each",
                         &Layout::expert_tp, true));
  t.push_back(text_field(
      "schedule", "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1", false,
      [](const Layout& l) { return std::string(pp::schedule_kind_name(l.schedule)); },
      [](Layout& l, const std::string& v) { l.schedule = pp::schedule_kind_from_name(v); }));
  t.push_back(member_field("micro-batches",
                        "micro-batches per step on each data-parallel rank (gradient accumulation; 0: 1 without a "
                        "pipeline, else max(4, pp), a multiple of pp when interleaved)",
                        &Layout::num_micro, false));
  t.push_back(member_field("chunks", "virtual stages per pipeline rank (interleaved schedule)", &Layout::num_chunks, true));
  t.push_back(text_field(
      "stage-layers", "blocks per stage, e.g. 3,1 (empty: balanced by cost)", true,
      [](const Layout& l) { return join_counts(l.layers_per_stage); },
      [](Layout& l, const std::string& v) { l.layers_per_stage = parse_counts(v); }));
  t.push_back(member_field("zero", "ZeRO stage over dp: 0 (off), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters)",
                        &Layout::zero, false));
  t.push_back(text_field(
      "offload", "host memory for: none, optimizer (--zero >= 1), optimizer+params (--zero 3)", false,
      [](const Layout& l) { return std::string(dp::offload_name(l.offload)); },
      [](Layout& l, const std::string& v) { l.offload = dp::parse_offload(v); }));
  t.push_back(text_field(
      "recompute", "activation recompute: none, full, every:K, selective", false,
      [](const Layout& l) { return l.recompute; }, [](Layout& l, const std::string& v) { l.recompute = v; }));
  return t;
}

}  // namespace

std::string LayoutField::json_key() const {
  std::string k = name;
  for (char& c : k) {
    if (c == '-') c = '_';
  }
  return k;
}

const std::vector<LayoutField>& layout_fields() {
  static const std::vector<LayoutField> fields = make_fields();
  return fields;
}

int Layout::default_micro_batches() const {
  if (pp <= 1) return 1;
  int m = std::max(4, pp);
  if (schedule == pp::ScheduleKind::kInterleaved1F1B) m = (m + pp - 1) / pp * pp;
  return m;
}

Layout Layout::resolved(int world_size) const {
  Layout l = *this;
  TORUS_CHECK(tp >= 1 && pp >= 1 && ep >= 1, InvalidArgument,
              "layout: tp, pp and ep must be >= 1 (got tp={} pp={} ep={})", tp, pp, ep);
  if (l.dp == 0) {
    TORUS_CHECK(world_size % (tp * pp * ep) == 0, InvalidArgument,
                "--tp x --pp x --ep = {} x {} x {} does not divide the {} ranks", tp, pp, ep, world_size);
    l.dp = world_size / (tp * pp * ep);
  }
  if (l.num_micro == 0) l.num_micro = l.default_micro_batches();
  return l;
}

void Layout::check() const {
  TORUS_CHECK(tp >= 1 && pp >= 1 && ep >= 1 && dp >= 0 && num_micro >= 0 && num_chunks >= 1, InvalidArgument,
              "--tp, --pp, --ep and --chunks must be >= 1, --dp and --micro-batches >= 0 (0: the default); got "
              "tp={} pp={} ep={} chunks={} dp={} micro-batches={}",
              tp, pp, ep, num_chunks, dp, num_micro);
  dp::check_zero_stage(zero, offload);
  TORUS_CHECK(recompute == "none" || recompute == "full" || recompute == "selective" ||
                  recompute.rfind("every:", 0) == 0,
              InvalidArgument, "--recompute must be none, full, every:K or selective, got '{}'", recompute);
  for (int64_t n : layers_per_stage) {
    TORUS_CHECK(n >= 0, InvalidArgument, "--stage-layers: a stage cannot hold {} blocks", n);
  }
}

void Layout::validate(int world_size) const {
  check();
  TORUS_CHECK(dp >= 1, InvalidArgument, "layout: dp must be >= 1 (resolve the layout for the world first), got {}",
              dp);
  TORUS_CHECK(num_micro >= 1, InvalidArgument, "layout: num_micro must be >= 1, got {}", num_micro);
  TORUS_CHECK(tp * pp * dp * ep == world_size, InvalidArgument,
              "layout: tp x pp x dp x ep = {} x {} x {} x {} = {} ranks, but the world has {}", tp, pp, dp, ep,
              tp * pp * dp * ep, world_size);
  if (num_chunks > 1) {
    TORUS_CHECK(schedule == pp::ScheduleKind::kInterleaved1F1B, InvalidArgument,
                "layout: {} chunks per pipeline rank need the interleaved schedule, not '{}'", num_chunks,
                pp::schedule_kind_name(schedule));
    TORUS_CHECK(pp >= 2, InvalidArgument, "layout: the interleaved schedule with {} chunks needs pp >= 2", num_chunks);
    TORUS_CHECK(num_micro % pp == 0, InvalidArgument,
                "layout: the interleaved schedule needs num_micro ({}) to be a multiple of pp ({})", num_micro, pp);
  }
  if (!layers_per_stage.empty()) {
    TORUS_CHECK(static_cast<int>(layers_per_stage.size()) == num_stages(), InvalidArgument,
                "layout: {} layer counts given for {} stages (pp x chunks = {} x {})", layers_per_stage.size(),
                num_stages(), pp, num_chunks);
  }
}

std::vector<std::pair<std::string, int>> Layout::mesh_dims() const {
  return {{"pp", pp}, {"dp", dp}, {"ep", ep}, {"tp", tp}};
}

int Layout::world_size() const {
  int n = 1;
  for (const auto& [name, size] : mesh_dims()) n *= size;
  return n;
}

std::string Layout::describe() const {
  std::string s = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
  if (ep > 1) s += " ep=" + std::to_string(ep);
  if (sequence_parallel) s += " sp";
  if (expert_tp) s += " expert-tp";
  s += ", " + std::string(pp::schedule_kind_name(schedule));
  if (num_chunks > 1) s += " v=" + std::to_string(num_chunks);
  s += ", m=" + std::to_string(num_micro);
  if (zero > 0) s += ", zero=" + std::to_string(zero);
  if (offload != dp::Offload::kNone) s += " offload=" + std::string(dp::offload_name(offload));
  if (recompute != "none") s += ", recompute=" + recompute;
  return s;
}

std::string Layout::to_json() const {
  Json j = Json::object();
  for (const LayoutField& f : layout_fields()) {
    const std::string v = f.get(*this);
    switch (f.kind) {
      case Kind::kInt: j[f.json_key()] = std::stoll(v); break;
      case Kind::kBool: j[f.json_key()] = (v == "true"); break;
      case Kind::kText: j[f.json_key()] = v; break;
    }
  }
  return j.dump();
}

Layout Layout::with_json(const std::string& text) const {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("layout: not JSON: {}", e.what()));
  }
  TORUS_CHECK(j.is_object(), InvalidArgument, "layout: expected a JSON object, got {}", j.type_name());
  Layout l = *this;
  for (const LayoutField& f : layout_fields()) {
    if (!j.contains(f.json_key())) continue;
    const Json& v = j[f.json_key()];
    switch (f.kind) {
      case Kind::kInt:
        TORUS_CHECK(v.is_number_integer(), InvalidArgument, "layout: \"{}\" must be an integer, got {}", f.json_key(),
                    v.dump());
        f.set(l, std::to_string(v.get<int64_t>()));
        break;
      case Kind::kBool:
        TORUS_CHECK(v.is_boolean(), InvalidArgument, "layout: \"{}\" must be true or false, got {}", f.json_key(),
                    v.dump());
        f.set(l, v.get<bool>() ? "true" : "false");
        break;
      case Kind::kText:
        TORUS_CHECK(v.is_string(), InvalidArgument, "layout: \"{}\" must be a string, got {}", f.json_key(), v.dump());
        f.set(l, v.get<std::string>());
        break;
    }
  }
  return l;
}

std::vector<std::string> Layout::args() const {
  std::vector<std::string> out;
  for (const LayoutField& f : layout_fields()) {
    const std::string v = f.get(*this);
    if (f.kind == Kind::kBool) {
      out.push_back((v == "true" ? "--" : "--no-") + f.name);
    } else if (v.empty()) {
      continue;  // an empty text is the field's default (no stage cut): nothing to say
    } else {
      out.push_back("--" + f.name);
      out.push_back(v);
    }
  }
  return out;
}

bool Layout::same_placement(const Layout& other) const {
  for (const LayoutField& f : layout_fields()) {
    if (f.placement && f.get(*this) != f.get(other)) return false;
  }
  return true;
}

bool Layout::operator==(const Layout& other) const {
  for (const LayoutField& f : layout_fields()) {
    if (f.get(*this) != f.get(other)) return false;
  }
  return true;
}

}  // namespace parallel
}  // namespace torus
