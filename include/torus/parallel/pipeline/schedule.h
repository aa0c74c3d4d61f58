// torus/parallel/pipeline/schedule.h — pipeline schedules as data.
//
// A Schedule is, for every pipeline rank, the ordered list of actions that
// rank performs in one training step: forward and backward computations of
// (micro-batch, chunk) pairs, and the sends and receives that move
// activations and gradients between neighbouring stages. Generators produce
// the classic schedules (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1);
// simulate() checks any schedule — generated or hand-made — and computes its
// bubble and memory; PipelineExecutor (executor.h) runs a valid one.
// Everything here is plain data and free of LibTorch.
//
// Note [Stage layout]: p ranks, each holding v chunks (virtual stages), make
// S = p*v stages. Chunk c of rank r is stage s = c*p + r (Megatron's
// interleaved placement), so stage s feeds stage s+1, which lives on rank
// (r+1) mod p. Stage 0 (rank 0, chunk 0) reads the data; stage S-1
// (rank p-1, chunk v-1) computes the loss.
//
// Note [Communication semantics]: this is the contract shared by simulate()
// and the executor. A rank runs its actions strictly in order.
//  * Send* is asynchronous: it never blocks; the message is in flight from
//    that moment until the peer receives it.
//  * Recv* blocks until the matching message has been sent.
//  * Messages match by (direction, micro-batch, edge), where edge s is the
//    link between stages s and s+1; an activation crosses it from s to s+1,
//    a gradient from s+1 to s. Each message is sent and received once.
//  * Forward(mb, c) needs its input received (RecvActivation) earlier unless
//    it is stage 0; Backward/BackwardInput needs its forward done and, unless
//    it is the last stage, its output gradient received (RecvGrad) earlier;
//    BackwardWeight needs BackwardInput; a send needs the value it sends.
// A schedule obeying these rules whose simulation reaches the end on every
// rank, with every message received, runs on the executor without deadlock.
//
// Cost model: CostModel times are for one micro-batch through one rank's
// whole share of the model; with v chunks a chunk's action costs 1/v of it,
// so schedules with different v compare at equal work per rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace torus::pp {

enum class ActionKind : uint8_t {
  kForward,         // F:  forward of (micro, chunk)
  kBackwardInput,   // BI: gradient with respect to the chunk's input (dX)
  kBackwardWeight,  // BW: gradient with respect to the chunk's weights (dW)
  kBackward,        // B:  fused BI + BW
  kSendActivation,  // SA: send the forward output to the next stage
  kRecvActivation,  // RA: receive the forward input from the previous stage
  kSendGrad,        // SG: send the input gradient to the previous stage
  kRecvGrad,        // RG: receive the output gradient from the next stage
};

// Short code used in the compact text form: "F", "BI", "BW", "B", "SA", ...
std::string_view action_kind_code(ActionKind kind);
// Long name for messages: "Forward", "BackwardInput", ...
std::string_view action_kind_name(ActionKind kind);
bool is_compute(ActionKind kind);
bool is_send(ActionKind kind);
bool is_recv(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro = 0;  // micro-batch, in [0, num_micro)
  int chunk = 0;  // the acting rank's chunk, in [0, num_chunks)
  int peer = -1;  // communication actions: the other rank; -1 otherwise

  // "RecvGrad(micro 3, chunk 1, from rank 2)".
  std::string describe() const;
  // Compact token: "F3", "F3.1" (chunk 1), "SA3@1" (peer 1), "RG3.1@2".
  std::string token() const;
  friend bool operator==(const Action&, const Action&) = default;
};

struct Schedule {
  std::string name;
  int num_ranks = 1;                         // p
  int num_micro = 1;                         // m
  int num_chunks = 1;                        // v
  std::vector<std::vector<Action>> actions;  // actions[rank], in execution order
  // Forwards only (evaluation): no backward actions, and none is expected.
  bool forward_only = false;

  int num_stages() const { return num_ranks * num_chunks; }
  int stage(int rank, int chunk) const { return chunk * num_ranks + rank; }
  int rank_of_stage(int stage) const { return stage % num_ranks; }
  int chunk_of_stage(int stage) const { return stage / num_ranks; }
  bool is_first_stage(int rank, int chunk) const { return stage(rank, chunk) == 0; }
  bool is_last_stage(int rank, int chunk) const { return stage(rank, chunk) == num_stages() - 1; }

  // "schedule '1f1b' (p=4, m=8, v=1)".
  std::string describe() const;
  // One line per rank: "rank 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 ...".
  std::string to_string() const;
};

// ---- generators ------------------------------------------------------------------
//
// Every generator returns a complete schedule (compute and communication) that
// simulate() accepts, and throws InvalidArgument on bad sizes (p, m >= 1).

enum class ScheduleKind : uint8_t { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1 };
inline constexpr ScheduleKind kAllScheduleKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                                     ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1};

// "gpipe", "1f1b", "interleaved", "zb-h1".
std::string_view schedule_kind_name(ScheduleKind kind);
// Accepts the names above (case-insensitive; also "interleaved-1f1b",
// "zbh1", "zero-bubble"); throws InvalidArgument listing the valid names.
ScheduleKind schedule_kind_from_name(std::string_view name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int num_ranks = 1;
  int num_micro = 1;
  int num_chunks = 1;  // interleaved only; every other kind needs 1
};
Schedule make_schedule(const ScheduleOptions& options);

// All forwards, then all (fused) backwards. Peak live activations: m.
Schedule gpipe(int num_ranks, int num_micro);
// Warm-up of p-1-r forwards on rank r, then one forward / one backward,
// then the remaining backwards. Peak live activations on rank r: min(p-r, m).
Schedule one_f_one_b(int num_ranks, int num_micro);
// Megatron's interleaved 1F1B with v chunks per rank. v > 1 needs p >= 2 and
// m a multiple of p (micro-batches advance in groups of p per chunk).
Schedule interleaved_1f1b(int num_ranks, int num_micro, int num_chunks);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order of
// forwards and input-gradient backwards, with rank r deferring its first r
// weight-gradient computations so that they fill the cool-down bubble. Peak
// live activations p on every rank (the peak of 1F1B).
Schedule zero_bubble_h1(int num_ranks, int num_micro);

// Evaluation: every forward of every (micro, chunk), micro-batch after
// micro-batch, each rank's chunks in stage order, with their activation
// transfers; forward_only is set (simulate() then expects no backward).
Schedule forward_only(int num_ranks, int num_micro, int num_chunks = 1);
// Inserts the communication actions into a schedule holding only compute
// actions, at the latest point for receives and the earliest for sends:
// RecvActivation right before each forward that needs one, SendActivation
// right after it; RecvGrad right before each Backward/BackwardInput that
// needs one, SendGrad right after it. Throws InvalidArgument if `schedule`
// already holds communication actions.
void add_communication(Schedule& schedule);

// Parses the compact form of to_string(): one string per rank, tokens
// separated by spaces ("F0 SA0 RG0 B0"); a line may start with "rank N:".
// Peers left out ("SA0") are the neighbouring stage's rank. Throws
// InvalidArgument naming the rank and token it cannot read.
Schedule parse_schedule(std::string name, int num_ranks, int num_micro, int num_chunks,
                        const std::vector<std::string>& ranks);

// ---- validation and simulation ------------------------------------------------------

// One problem found in a schedule. `message` is a full sentence naming the
// rank, the position and the action ("rank 1, action #4 RecvGrad(micro 0,
// chunk 0, from rank 2): ...").
struct ScheduleIssue {
  int rank = -1;   // -1: the schedule as a whole
  int index = -1;  // position in actions[rank]; -1: none
  std::string message;
};

struct CostModel {
  double forward = 1.0;          // t_F
  double backward_input = 1.0;   // t_B; a fused Backward costs t_B + t_W
  double backward_weight = 1.0;  // t_W
  double comm = 0.0;             // from a send to the arrival at the peer
};

struct RankStats {
  double busy = 0;    // sum of compute costs
  double finish = 0;  // time of its last action
  double bubble = 0;  // (makespan - busy) / makespan
  int peak_live = 0;  // max number of (micro, chunk) pairs forwarded but not
                      // yet through their backward (fused or weight part)
};

struct Simulation {
  std::vector<ScheduleIssue> issues;  // empty: the schedule is valid
  double makespan = 0;                // when the last rank finishes
  std::vector<RankStats> ranks;       // meaningful only when ok()

  bool ok() const { return issues.empty(); }
  // Mean over ranks of RankStats::bubble = total idle / (p * makespan).
  double bubble() const;
  // Max over ranks of RankStats::peak_live.
  int peak_live() const;
};

// Runs every rank of `schedule` under Note [Communication semantics] with
// the given costs (all ranks start at 0). Problems found: actions out of
// range; a peer that is not the neighbouring stage's rank; communication
// that the first or last stage cannot do; an action run twice; a forward
// before its input arrived; a backward before its forward or its output
// gradient; a weight-gradient without its input-gradient; a send of a value
// not yet computed; a deadlock (each blocked rank with the receive it waits
// in, what its peer is doing, and the wait cycle); a message never received;
// a (micro, chunk) missing its forward or backward. Never throws for a bad
// schedule; throws InvalidArgument for a malformed one (negative sizes,
// actions.size() != num_ranks) or negative costs.
Simulation simulate(const Schedule& schedule, const CostModel& costs = {});

// Replays a recorded run: as above, but action i of rank r takes
// durations[r][i] (compute actions; the entries of communication actions are
// ignored) and every message `comm`. Used to tell the idle time a schedule
// implies for the durations a run actually had from the idle time its
// execution added. Throws InvalidArgument unless durations has one entry per
// action, each >= 0.
Simulation simulate(const Schedule& schedule, const std::vector<std::vector<double>>& durations, double comm = 0);

// simulate(schedule).issues.
std::vector<ScheduleIssue> validate(const Schedule& schedule);
// Throws InvalidArgument if the schedule is invalid; the message starts
// with schedule.describe() and lists the issues (the first 8 of them).
void check_schedule(const Schedule& schedule);

// Closed-form bubble fraction of a generated schedule kind, for comparison
// with simulate() (communication cost ignored):
//   GPipe, 1F1B:   (p-1) / (m + p - 1)
//   interleaved:   (p-1) / (v*m + p - 1)
//   ZB-H1:         (p-1)(t_F + t_B - t_W) / (m(t_F + t_B + t_W) + (p-1)(t_F + t_B - t_W)),
//                  exact when m >= p and t_W <= min(t_F, t_B) (the simulated
//                  bubble is larger outside that range); with t_F = t_B = t_W
//                  its idle time is 1/3 of 1F1B's.
double closed_form_bubble(ScheduleKind kind, int num_ranks, int num_micro, int num_chunks, const CostModel& costs = {});

}  // namespace torus::pp
