// The layout value (parallel/layout.h): its field table drives every form —
// the JSON, the arguments, the placement comparison — so each form is
// checked here against values written out by hand, and each rule once.
#include "torus/parallel/layout.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "torus/core/error.h"

namespace torus::parallel {
namespace {

Layout sample() {
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.dp = 3;
  l.ep = 1;
  l.sequence_parallel = true;
  l.schedule = pp::ScheduleKind::kInterleaved1F1B;
  l.num_micro = 4;
  l.num_chunks = 2;
  l.layers_per_stage = {3, 1, 2, 2};
  l.zero = 3;
  l.offload = dp::Offload::kOptimizerAndParams;
  l.recompute = "every:2";
  return l;
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Layout, JsonHasEveryFieldTyped) {
  const nlohmann::json j = nlohmann::json::parse(sample().to_json());
  EXPECT_EQ(j.size(), layout_fields().size());
  EXPECT_EQ(j["tp"], 2);
  EXPECT_EQ(j["dp"], 3);
  EXPECT_EQ(j["sp"], true);
  EXPECT_EQ(j["expert_tp"], false);
  EXPECT_EQ(j["schedule"], "interleaved");
  EXPECT_EQ(j["micro_batches"], 4);
  EXPECT_EQ(j["chunks"], 2);
  EXPECT_EQ(j["stage_layers"], "3,1,2,2");
  EXPECT_EQ(j["zero"], 3);
  EXPECT_EQ(j["offload"], "optimizer+params");
  EXPECT_EQ(j["recompute"], "every:2");
}

TEST(Layout, JsonAndArgsRoundTrip) {
  const Layout l = sample();
  EXPECT_EQ(Layout{}.with_json(l.to_json()), l);
  // Keys absent keep the receiver's values; unknown keys are a manifest's.
  const Layout partial = Layout{}.with_json(R"({"tp": 4, "world_size": 8, "stages": []})");
  EXPECT_EQ(partial.tp, 4);
  EXPECT_EQ(partial.pp, 1);
  EXPECT_NE(message([] { (void)Layout{}.with_json(R"({"tp": "two"})"); }).find("\"tp\""), std::string::npos);
  EXPECT_NE(message([] { (void)Layout{}.with_json("[1]"); }).find("object"), std::string::npos);
  const std::vector<std::string> args = l.args();
  const std::vector<std::string> want = {"--tp",         "2",     "--pp",        "2",         "--dp",       "3",
                                         "--ep",         "1",     "--sp",        "--no-expert-tp",          "--schedule",
                                         "interleaved", "--micro-batches", "4", "--chunks", "2", "--stage-layers",
                                         "3,1,2,2",     "--zero", "3",           "--offload", "optimizer+params",
                                         "--recompute", "every:2"};
  EXPECT_EQ(args, want);
  Layout empty_cut;
  const std::vector<std::string> e = empty_cut.args();
  // An empty text field is its default and is left out (an empty argument would not survive a shell).
  EXPECT_EQ(std::find(e.begin(), e.end(), "--stage-layers"), e.end());
  EXPECT_EQ(std::count(e.begin(), e.end(), std::string()), 0);
}

TEST(Layout, FieldsHaveUniqueNamesAndSetTheirValue) {
  std::set<std::string> names;
  for (const LayoutField& f : layout_fields()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    // set(get()) is the identity on a non-default value.
    Layout l = sample();
    const std::string v = f.get(l);
    Layout m;
    f.set(m, v);
    EXPECT_EQ(f.get(m), v) << f.name;
  }
  Layout l;
  EXPECT_NE(message([&] { layout_fields()[0].set(l, "x"); }).find("--tp"), std::string::npos);
}

TEST(Layout, ResolvedFillsDpAndMicroBatches) {
  Layout l;
  l.tp = 2;
  const Layout r = l.resolved(8);
  EXPECT_EQ(r.dp, 4);
  EXPECT_EQ(r.num_micro, 1);  // no pipeline: no accumulation by default
  EXPECT_EQ(r.world_size(), 8);
  l.pp = 2;
  EXPECT_EQ(l.resolved(8).num_micro, 4);
  l.pp = 6;
  l.tp = 1;
  EXPECT_EQ(l.resolved(6).num_micro, 6);  // at least one per stage
  l.pp = 3;
  l.schedule = pp::ScheduleKind::kInterleaved1F1B;
  EXPECT_EQ(l.resolved(6).num_micro, 6);  // a multiple of pp
  l.num_micro = 5;
  EXPECT_EQ(l.resolved(6).num_micro, 5);  // given: kept
  Layout bad;
  bad.tp = 3;
  EXPECT_NE(message([&] { (void)bad.resolved(4); }).find("does not divide the 4 ranks"), std::string::npos);
}

TEST(Layout, RulesAreCheckedOnce) {
  Layout l;
  l.zero = 4;
  EXPECT_EQ(message([&] { l.check(); }), "--zero must be 0, 1, 2 or 3, got 4");
  l.zero = 0;
  l.offload = dp::Offload::kOptimizer;
  EXPECT_EQ(message([&] { l.check(); }), "--offload optimizer needs ZeRO: use it with --zero 1, 2 or 3 (got --zero 0)");
  l.zero = 2;
  l.offload = dp::Offload::kOptimizerAndParams;
  EXPECT_EQ(message([&] { l.check(); }),
            "--offload optimizer+params offloads parameter shards: it needs --zero 3 (got --zero 2)");
  l = Layout{};
  l.recompute = "some";
  EXPECT_NE(message([&] { l.check(); }).find("--recompute"), std::string::npos);
  l = Layout{}.resolved(4);
  EXPECT_NO_THROW(l.validate(4));
  EXPECT_NE(message([&] { l.validate(8); }).find("but the world has 8"), std::string::npos);
  l.num_chunks = 2;
  EXPECT_NE(message([&] { l.validate(4); }).find("interleaved"), std::string::npos);
  EXPECT_EQ(dp::parse_offload("optimizer"), dp::Offload::kOptimizer);
  EXPECT_EQ(message([] { (void)dp::parse_offload("gpu"); }),
            "--offload must be one of none, optimizer, optimizer+params, got 'gpu'");
}

TEST(Layout, PlacementAndMesh) {
  const Layout a = sample();
  Layout b = a;
  b.zero = 1;
  b.offload = dp::Offload::kNone;
  b.num_micro = 8;
  b.recompute = "full";
  b.schedule = pp::ScheduleKind::k1F1B;
  EXPECT_TRUE(a.same_placement(b));  // the same slices on every rank
  EXPECT_NE(a, b);
  b.tp = 1;
  EXPECT_FALSE(a.same_placement(b));
  const auto dims = a.mesh_dims();
  ASSERT_EQ(dims.size(), 4u);
  EXPECT_EQ(dims.back().first, "tp");  // innermost: a TP group stays inside a node
  std::set<std::string> marked, listed;
  for (const LayoutField& f : layout_fields()) {
    if (f.mesh) marked.insert(f.name);
  }
  for (const auto& [name, size] : dims) listed.insert(name);
  EXPECT_EQ(marked, listed);  // the table and the mesh order name the same dimensions
  EXPECT_EQ(a.world_size(), 2 * 2 * 3);
  EXPECT_EQ(a.describe(), "tp=2 pp=2 dp=3 sp, interleaved v=2, m=4, zero=3 offload=optimizer+params, recompute=every:2");
}

}  // namespace
}  // namespace torus::parallel
