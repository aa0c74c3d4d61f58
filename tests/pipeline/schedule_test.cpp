// Single-process tests of pipeline schedules as data (LibTorch-free): every
// generator yields valid schedules over a grid of sizes; simulated bubbles
// equal the closed forms; live-activation peaks (1F1B <= p on the first
// stage); ZB-H1 below 1F1B; the validator rejects hand-made broken schedules
// (deadlocks, missing work, wrong order, mismatched peers) naming rank and
// action; text form round trips.
#include "torus/parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <string>

#include "torus/core/error.h"

namespace torus::pp {
namespace {

std::string error_of(const Schedule& s) {
  try {
    check_schedule(s);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string all_issues(const Schedule& s) {
  std::string out;
  for (const auto& i : validate(s)) out += i.message + "\n";
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Schedule, EveryGeneratorIsValidOverAGridOfSizes) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 17; ++m) {
      for (auto s : {gpipe(p, m), one_f_one_b(p, m), zero_bubble_h1(p, m), interleaved_1f1b(p, m, 1)}) {
        EXPECT_EQ(all_issues(s), "") << s.describe() << "\n" << s.to_string();
      }
      for (int v = 2; v <= 4 && p >= 2; ++v) {
        if (m % p != 0) continue;
        Schedule s = interleaved_1f1b(p, m, v);
        EXPECT_EQ(all_issues(s), "") << s.describe() << "\n" << s.to_string();
      }
    }
  }
}

TEST(Schedule, SimulatedBubbleMatchesClosedForms) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        Schedule s = make_schedule({kind, p, m, 1});
        Simulation sim = simulate(s);
        ASSERT_TRUE(sim.ok());
        EXPECT_NEAR(sim.bubble(), closed_form_bubble(kind, p, m, 1), 1e-12) << s.describe();
        for (const auto& r : sim.ranks) EXPECT_NEAR(r.bubble, sim.bubble(), 1e-12) << s.describe();
      }
      for (int v = 2; v <= 4 && p >= 2 && m % p == 0; ++v) {
        Simulation sim = simulate(interleaved_1f1b(p, m, v));
        ASSERT_TRUE(sim.ok());
        EXPECT_NEAR(sim.bubble(), closed_form_bubble(ScheduleKind::kInterleaved1F1B, p, m, v), 1e-12)
            << "p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(Schedule, ZeroBubbleH1MatchesItsClosedFormAndBeats1F1B) {
  // The closed form holds for m >= p and t_W <= min(t_F, t_B).
  const CostModel costs[] = {{1, 1, 1, 0}, {1, 2, 1, 0}, {2, 1, 1, 0}, {1, 1, 0.5, 0}, {1, 3, 1, 0}};
  for (const CostModel& c : costs) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = p; m <= 3 * p; ++m) {
        Simulation zb = simulate(zero_bubble_h1(p, m), c);
        Simulation ofob = simulate(one_f_one_b(p, m), c);
        ASSERT_TRUE(zb.ok() && ofob.ok());
        EXPECT_NEAR(zb.bubble(), closed_form_bubble(ScheduleKind::kZeroBubbleH1, p, m, 1, c), 1e-12)
            << "p=" << p << " m=" << m << " costs " << c.forward << "," << c.backward_input << "," << c.backward_weight;
        EXPECT_LT(zb.bubble(), ofob.bubble());
      }
    }
  }
  // Equal costs: ZB-H1 idles a third of 1F1B's time, (p-1) vs 3(p-1).
  for (int p = 2; p <= 8; ++p) {
    Simulation zb = simulate(zero_bubble_h1(p, 2 * p));
    Simulation ofob = simulate(one_f_one_b(p, 2 * p));
    const double idle_zb = zb.makespan - zb.ranks[0].busy;
    const double idle_1f1b = ofob.makespan - ofob.ranks[0].busy;
    EXPECT_NEAR(idle_zb, p - 1, 1e-12);
    EXPECT_NEAR(idle_1f1b, 3.0 * (p - 1), 1e-12);
  }
}

TEST(Schedule, PeakLiveActivations) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      Simulation g = simulate(gpipe(p, m));
      Simulation f = simulate(one_f_one_b(p, m));
      Simulation z = simulate(zero_bubble_h1(p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.ranks[r].peak_live, m);
        EXPECT_EQ(f.ranks[r].peak_live, std::min(p - r, m)) << "p=" << p << " m=" << m << " rank " << r;
        EXPECT_LE(z.ranks[r].peak_live, std::min(p, m)) << "p=" << p << " m=" << m << " rank " << r;
      }
      EXPECT_EQ(f.peak_live(), std::min(p, m));
      EXPECT_EQ(z.peak_live(), f.peak_live()) << "ZB-H1 has the memory of 1F1B";
    }
  }
}

TEST(Schedule, CommunicationCostOnlyLengthensTheStep) {
  Schedule s = one_f_one_b(4, 8);
  Simulation free = simulate(s);
  Simulation slow = simulate(s, CostModel{1, 1, 1, 0.25});
  EXPECT_GT(slow.makespan, free.makespan);
  EXPECT_GT(slow.bubble(), free.bubble());
  EXPECT_NEAR(slow.ranks[0].busy, free.ranks[0].busy, 1e-12);
}

TEST(Schedule, ReplayOfRecordedDurations) {
  // Durations equal to the cost model's reproduce its simulation exactly.
  const CostModel c{1, 2, 0.5, 0.1};
  for (const Schedule& s : {one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2), zero_bubble_h1(3, 5)}) {
    std::vector<std::vector<double>> d(s.num_ranks);
    for (int r = 0; r < s.num_ranks; ++r) {
      for (const Action& a : s.actions[r]) {
        double t = 0;
        if (a.kind == ActionKind::kForward) t = c.forward;
        if (a.kind == ActionKind::kBackwardInput) t = c.backward_input;
        if (a.kind == ActionKind::kBackwardWeight) t = c.backward_weight;
        if (a.kind == ActionKind::kBackward) t = c.backward_input + c.backward_weight;
        d[r].push_back(t / s.num_chunks);
      }
    }
    Simulation model = simulate(s, c);
    Simulation replay = simulate(s, d, c.comm);
    ASSERT_TRUE(replay.ok());
    EXPECT_NEAR(replay.makespan, model.makespan, 1e-12) << s.describe();
    EXPECT_NEAR(replay.bubble(), model.bubble(), 1e-12) << s.describe();
    // One slow forward on rank 0 delays everybody: the others idle longer.
    d[0][0] += 3.0;
    Simulation slow = simulate(s, d, c.comm);
    EXPECT_NEAR(slow.makespan, model.makespan + 3.0, 1e-12) << s.describe();
    EXPECT_GT(slow.ranks[1].bubble, model.ranks[1].bubble);
  }
  EXPECT_THROW(simulate(one_f_one_b(2, 2), std::vector<std::vector<double>>{{1.0}}), InvalidArgument);
}

TEST(Schedule, BadSizesAreRejectedClearly) {
  EXPECT_THROW(one_f_one_b(0, 4), InvalidArgument);
  EXPECT_THROW(gpipe(2, 0), InvalidArgument);
  try {
    interleaved_1f1b(4, 6, 2);
    FAIL() << "m not a multiple of p must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "multiple of the pipeline size")) << e.what();
    EXPECT_TRUE(contains(e.what(), "m=6")) << e.what();
  }
  EXPECT_THROW(interleaved_1f1b(1, 4, 2), InvalidArgument);
  EXPECT_THROW(make_schedule({ScheduleKind::k1F1B, 2, 4, 2}), InvalidArgument);
  EXPECT_EQ(schedule_kind_from_name("ZB-H1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(schedule_kind_from_name("interleaved"), ScheduleKind::kInterleaved1F1B);
  EXPECT_THROW(schedule_kind_from_name("pipedream"), InvalidArgument);
  for (auto k : kAllScheduleKinds) EXPECT_EQ(schedule_kind_from_name(schedule_kind_name(k)), k);
}

TEST(Schedule, TextFormRoundTrips) {
  for (Schedule s : {one_f_one_b(3, 5), interleaved_1f1b(2, 4, 2), zero_bubble_h1(4, 4)}) {
    std::vector<std::string> lines;
    std::string text = s.to_string();
    for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      lines.push_back(text.substr(pos, nl - pos));
    }
    Schedule back = parse_schedule(s.name, s.num_ranks, s.num_micro, s.num_chunks, lines);
    EXPECT_EQ(back.actions, s.actions) << s.to_string();
  }
  EXPECT_EQ(one_f_one_b(2, 2).to_string(),
            "rank 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 RG1@1 B1\n"
            "rank 1: RA0@0 F0 B0 SG0@0 RA1@0 F1 B1 SG1@0\n");
  EXPECT_THROW(parse_schedule("x", 1, 1, 1, {"F0 Q1"}), InvalidArgument);
  EXPECT_THROW(parse_schedule("x", 1, 1, 1, {"F0@1"}), InvalidArgument);
  EXPECT_THROW(parse_schedule("x", 2, 1, 1, {"F0"}), InvalidArgument);
}

// The hand-made deadlock of issue 6: rank 0 waits for the gradient of
// micro-batch 0 before it sends the activation that rank 1 needs to produce
// that gradient.
TEST(Validator, RejectsAHandMadeDeadlockNamingRankAndAction) {
  Schedule s = parse_schedule("deadlock", 2, 1, 1, {"F0 RG0 SA0 B0", "RA0 F0 B0 SG0"});
  std::string msg = error_of(s);
  ASSERT_FALSE(msg.empty());
  EXPECT_TRUE(contains(msg, "schedule 'deadlock' (p=2, m=1, v=1)")) << msg;
  EXPECT_TRUE(contains(msg, "deadlock: 2 of 2 ranks never finish")) << msg;
  EXPECT_TRUE(contains(msg, "wait cycle: rank 0 -> rank 1 -> rank 0")) << msg;
  EXPECT_TRUE(contains(msg, "rank 0, action #1 RecvGrad(micro 0, chunk 0, from rank 1): blocks forever")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1, action #0 RecvActivation(micro 0, chunk 0, from rank 0): blocks forever")) << msg;
  EXPECT_TRUE(contains(msg, "rank 0 sends it only at action #2")) << msg;
  auto issues = validate(s);
  ASSERT_GE(issues.size(), 3u);
  EXPECT_EQ(issues[1].rank, 0);
  EXPECT_EQ(issues[1].index, 1);
  EXPECT_EQ(issues[2].rank, 1);
  EXPECT_EQ(issues[2].index, 0);
}

TEST(Validator, ReportsAMessageThatIsNeverSent) {
  // Rank 1 forgets to send the gradient of micro-batch 1.
  Schedule s = parse_schedule("lost", 2, 2, 1, {"F0 SA0 F1 SA1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 RA1 F1 B1"});
  std::string msg = error_of(s);
  EXPECT_TRUE(contains(msg, "rank 0 waits for a message that is never sent")) << msg;
  EXPECT_TRUE(contains(msg,
                       "rank 0, action #6 RecvGrad(micro 1, chunk 0, from rank 1): blocks forever: "
                       "rank 1 never sends it"))
      << msg;
}

TEST(Validator, RejectsOrderAndCompletenessErrors) {
  // Backward before its forward.
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 1, 1, 1, {"B0 F0"})),
                       "rank 0, action #0 Backward(micro 0, chunk 0): is a backward before its forward"));
  // Forward on stage 1 before its input arrived.
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 2, 1, 1, {"F0 SA0 RG0 B0", "F0 RA0 B0 SG0"})),
                       "rank 1, action #0 Forward(micro 0, chunk 0): runs before its input was received"));
  // Backward on stage 0 before its output gradient arrived.
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 2, 1, 1, {"F0 SA0 B0 RG0", "RA0 F0 B0 SG0"})),
                       "rank 0, action #2 Backward(micro 0, chunk 0): runs before its output gradient"));
  // Micro-batch 1 has no backward; weight gradient without input gradient.
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 1, 2, 1, {"F0 F1 B0"})),
                       "rank 0 (stage 0) never runs the backward of micro-batch 1, chunk 0"));
  EXPECT_TRUE(
      contains(error_of(parse_schedule("x", 1, 1, 1, {"F0 BI0"})), "never runs the BackwardWeight of micro-batch 0"));
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 1, 1, 1, {"F0 BW0 BI0"})),
                       "runs before the BackwardInput of this micro-batch"));
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 1, 1, 1, {"F0 B0 BW0"})), "follows a fused Backward"));
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 1, 1, 1, {"F0 F0 B0"})), "runs a second time"));
  // A forward that is never run.
  EXPECT_TRUE(
      contains(error_of(parse_schedule("x", 1, 2, 1, {"F0 B0"})), "never runs the Forward of micro-batch 1, chunk 0"));
  // Sends before the value exists.
  EXPECT_TRUE(contains(error_of(parse_schedule("x", 2, 1, 1, {"SA0 F0 RG0 B0", "RA0 F0 B0 SG0"})),
                       "sends an activation its Forward has not computed yet"));
}

TEST(Validator, RejectsUnmatchedAndMismatchedCommunication) {
  // Rank 1 skips micro-batch 1: rank 0's activation is never received.
  std::string msg = error_of(parse_schedule("x", 2, 2, 1, {"F0 SA0 F1 SA1 RG0 B0", "RA0 F0 B0 SG0"}));
  EXPECT_TRUE(contains(msg,
                       "rank 0, action #3 SendActivation(micro 1, chunk 0, to rank 1): the message is never "
                       "received: rank 1 has no matching RecvActivation"))
      << msg;
  // A peer that is not the neighbouring stage's rank.
  msg = error_of(parse_schedule("x", 3, 1, 1, {"F0 SA0@2 RG0 B0", "RA0 F0 SA0 RG0 B0 SG0", "RA0 F0 B0 SG0"}));
  EXPECT_TRUE(contains(msg,
                       "rank 0, action #1 SendActivation(micro 0, chunk 0, to rank 2): mismatched peer: the "
                       "next stage 1 lives on rank 1, not rank 2"))
      << msg;
  // The last stage has nobody to send its activation to.
  msg = error_of(parse_schedule("x", 2, 1, 1, {"F0 SA0 RG0 B0", "RA0 F0 SA0@0 B0 SG0"}));
  EXPECT_TRUE(contains(msg, "is the last stage")) << msg;
  // Out-of-range micro-batch and chunk.
  msg = error_of(parse_schedule("x", 1, 1, 1, {"F0 B0 F3"}));
  EXPECT_TRUE(contains(msg, "rank 0, action #2 Forward(micro 3, chunk 0): micro-batch must be in [0, 1)")) << msg;
  // A chunk on a single rank would talk to itself.
  msg = error_of(parse_schedule("x", 1, 1, 2, {"F0 F0.1 B0.1 B0"}));
  EXPECT_TRUE(contains(msg, "needs at least 2 ranks")) << msg;
}

TEST(Validator, InterleavedStagesWrapAroundTheRanks) {
  // p=2, v=2: stages 0..3 on ranks 0,1,0,1; rank 1 chunk 0 (stage 1) feeds
  // rank 0 chunk 1 (stage 2).
  Schedule s = interleaved_1f1b(2, 2, 2);
  EXPECT_EQ(s.stage(1, 0), 1);
  EXPECT_EQ(s.stage(0, 1), 2);
  EXPECT_EQ(s.rank_of_stage(3), 1);
  EXPECT_TRUE(s.is_last_stage(1, 1));
  bool found = false;
  for (const Action& a : s.actions[1]) {
    if (a.kind == ActionKind::kSendActivation && a.chunk == 0) {
      EXPECT_EQ(a.peer, 0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(all_issues(s), "");
}

}  // namespace
}  // namespace torus::pp
