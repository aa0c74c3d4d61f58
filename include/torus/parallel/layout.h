// torus/parallel/layout.h — one value that describes how a run is laid out
// over its ranks: the sizes of the mesh's dimensions and every choice the
// planner makes besides them.
//
//   parallel::Layout l;                       // or from_args / from_json
//   l.tp = 2; l.pp = 2; l.zero = 1;
//   l = l.resolved(world->size());            // dp and micro-batches filled in
//   comm::DeviceMesh mesh(world, l.mesh_dims());
//
// Note [One layout]: every description of a layout goes through this type
// and its field table (layout_fields()): the option table of a run
// (run/run_config.h) adds one option per field, the planner's candidates
// and JSON, a checkpoint's manifest, the argument form a plan travels in
// (torus-plan --json "args", torus-launch) and the engine's mesh all read
// the fields from here. Adding a dimension is one member, one row of the
// table (src/parallel/layout.cpp), and its uses; no field list elsewhere.
//
// Forms of a field (written once, in the table):
//   option name   "micro-batches"       (command line, config files, Python keywords)
//   JSON key      "micro_batches"       (the option name with '_' for '-')
//   text value    "4", "true", "1f1b", "3,1"
// Thread safety: a value type. LibTorch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "torus/parallel/data/offload.h"
#include "torus/parallel/pipeline/schedule.h"

namespace torus::parallel {

struct Layout {
  // --- the mesh ------------------------------------------------------------
  int tp = 1;
  int pp = 1;
  int dp = 0;  // 0: the rest of the world, world / (tp x pp x ep) (resolved())
  // Expert parallelism (MoE models; Note [MoE groups] in
  // parallel/expert/moe.h): the world is pp x dp x ep x tp; the batch is
  // split over dp x ep (the data ranks), each expert lives on one ep rank.
  int ep = 1;
  // --- within the mesh -------------------------------------------------------
  bool sequence_parallel = false;  // --sp (with tp > 1)
  bool expert_tp = false;          // each expert's MLP split over tp (Note [Expert tensor parallelism])
  pp::ScheduleKind schedule = pp::ScheduleKind::k1F1B;
  // Micro-batches per step on each data rank (the gradient accumulation of a
  // step); 0: the default, default_micro_batches().
  int num_micro = 0;
  int num_chunks = 1;  // virtual stages per pipeline rank (interleaved only)
  // Blocks per stage, stage = chunk * pp + pipeline rank (pp * num_chunks
  // entries); empty: balanced by the model.
  std::vector<int64_t> layers_per_stage;
  // ZeRO over the data ranks (parallel/data/zero.h): 0 = plain data
  // parallelism; 1 = optimizer state and fp32 masters sharded; 2 = +
  // gradients; 3 = + parameters, gathered per block.
  int zero = 0;
  dp::Offload offload = dp::Offload::kNone;  // zero >= 1 (optimizer+params: 3)
  // Activation recompute (recompute/recompute.h): none, full, every:K,
  // selective. The model applies it; the planner chooses it.
  std::string recompute = "none";

  int num_stages() const { return pp * num_chunks; }
  int data_parallel() const { return dp * ep; }  // the ranks that read different rows

  // The micro-batches a step takes when num_micro is 0: 1 without a
  // pipeline (accumulation only slows a step down); with one, the smallest
  // count that keeps every stage busy in the steady state, at least 4 (the
  // schedule's bubble is (pp - 1) / (m + pp - 1) for 1F1B), rounded up to a
  // multiple of pp for the interleaved schedule.
  int default_micro_batches() const;
  // A copy with dp (when 0) and num_micro (when 0) filled in for
  // `world_size` ranks. Throws InvalidArgument when tp x pp x ep does not
  // divide the world.
  Layout resolved(int world_size) const;

  // The rules that need no world: sizes >= 1 (dp >= 0, num_micro >= 0), the
  // ZeRO stage and its offload (dp::check_zero_stage), chunks only with the
  // interleaved schedule, the recompute policy's form. InvalidArgument
  // naming the option. Pure.
  void check() const;
  // check(), and against `world_size` ranks for a resolved layout:
  // tp x pp x dp x ep = world_size, the interleaved schedule's micro-batches
  // a multiple of pp, one layer count per stage.
  void validate(int world_size) const;

  // The mesh's dimensions (the fields marked `mesh`), outermost first: pp,
  // dp, ep, tp (tp innermost, so that a TP group stays inside a node). For
  // comm::DeviceMesh.
  std::vector<std::pair<std::string, int>> mesh_dims() const;
  // The product of the mesh's dimensions (dp resolved).
  int world_size() const;

  // "tp=2 pp=2 dp=2 ep=2, 1f1b, m=4" (ep only when > 1; ZeRO, offload and
  // recompute when set).
  std::string describe() const;
  // One JSON object, a key per field, typed ({"tp": 2, "sp": false,
  // "schedule": "1f1b", ...}).
  std::string to_json() const;
  // Fields read from a JSON object (keys absent keep this value's; unknown
  // keys are ignored: a manifest holds more). InvalidArgument for a value
  // of the wrong type or outside its set.
  Layout with_json(const std::string& json) const;
  // The layout as command-line arguments ("--tp", "2", ..., "--sp" or
  // "--no-sp"), every field but a text field left empty (its default, e.g.
  // no --stage-layers): what torus-launch passes on from a plan.
  std::vector<std::string> args() const;
  // Whether the two layouts give every rank the same slices of the state
  // (the fields marked `placement` in the table): a checkpoint of one loads
  // into the other without resharding.
  bool same_placement(const Layout& other) const;

  bool operator==(const Layout& other) const;
  bool operator!=(const Layout& other) const { return !(*this == other); }
};

// One row of the field table (Note [One layout]).
struct LayoutField {
  enum class Kind { kInt, kBool, kText };
  std::string name;  // the option name, "micro-batches"
  Kind kind = Kind::kInt;
  std::string help;
  bool placement = false;  // decides which slices of the state a rank holds
  bool mesh = false;       // a dimension of the mesh: its size is a factor of the world
  std::function<std::string(const Layout&)> get;  // the text value
  // Sets the field from its text value; InvalidArgument naming the option
  // for a malformed value.
  std::function<void(Layout&, const std::string&)> set;
  std::string json_key() const;  // "micro_batches"
};
// Every field, in option-table order.
const std::vector<LayoutField>& layout_fields();

}  // namespace torus::parallel
