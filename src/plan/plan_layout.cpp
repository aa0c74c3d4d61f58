// --plan of a run: one layout for every rank (planner.h: plan_layout).
//
// Note [Plan above the run]: the planner sits above the run layer. The run
// (run::TrainLoop) takes a layout and knows nothing of how it was chosen;
// the front ends ask the planner for one when --plan is given and put it
// into the run's config before building the loop. The layout travels
// between the ranks as its JSON (parallel::Layout::to_json), not as
// command-line text parsed again.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "torus/comm/context.h"
#include "torus/core/error.h"
#include "torus/plan/planner.h"
#include "torus/run/run_config.h"

namespace torus::plan {

parallel::Layout plan_layout(const comm::ProcessGroupPtr& world, const run::RunConfig& c) {
  TORUS_CHECK(world != nullptr, InvalidArgument, "plan_layout: the world group is null");
  const Hardware* preset = find_hardware(c.plan_hardware);
  TORUS_CHECK(preset != nullptr, InvalidArgument, "--plan-hardware: unknown hardware '{}' (known: {})",
              c.plan_hardware, hardware_names());
  using Json = nlohmann::ordered_json;
  const comm::LaunchInfo& launch = world->context()->launch();
  const std::shared_ptr<comm::Store>& store = world->context()->store();
  const std::string key = "torus/plan/choice";
  std::string text;
  if (world->rank() == 0) {
    Json choice;
    try {
      PlanRequest req;
      req.run = c;
      req.run.plan = false;
      const int local = std::max(1, launch.local_size);
      if (c.plan_hardware == "cpu") {
        req.hardware = measure_cpu_host(local, c.precision);
        req.nodes = std::max(1, world->size() / local);
      } else {
        req.hardware = *preset;
        TORUS_CHECK(world->size() % req.hardware.devices_per_node == 0, InvalidArgument,
                    "--plan: {} ranks are not whole {} nodes of {} devices", world->size(), c.plan_hardware,
                    req.hardware.devices_per_node);
        req.nodes = world->size() / req.hardware.devices_per_node;
      }
      TORUS_CHECK(int64_t{req.nodes} * req.hardware.devices_per_node == world->size(), InvalidArgument,
                  "--plan: the world ({} ranks) is not {} hosts x {} ranks", world->size(), req.nodes,
                  req.hardware.devices_per_node);
      const Plan p = make_plan(req);
      TORUS_LOG_INFO("--plan ({}):\n{}", req.hardware.description, plan_table(p, 5));
      const Candidate* best = p.best();
      TORUS_CHECK(best != nullptr, InvalidArgument, "--plan: no layout fits ({} considered; the smallest: {})",
                  p.evaluated, explain(p.candidates.front(), p));
      parallel::Layout chosen = best->config.layout;
      chosen.layers_per_stage.clear();  // the model balances the stages
      choice = {{"layout", Json::parse(chosen.to_json())}, {"describe", best->layout()}};
    } catch (const InvalidArgument& e) {
      choice = {{"error", e.what()}};
    }
    text = choice.dump();
    if (world->size() > 1) store->set_string(key, text);
  } else {
    text = store->get_string(key, std::chrono::minutes(5));
  }
  const Json j = Json::parse(text);
  if (j.contains("error")) throw InvalidArgument(j["error"].get<std::string>());
  const parallel::Layout layout = parallel::Layout{}.with_json(j["layout"].dump());
  layout.check();
  if (world->rank() == 0) TORUS_LOG_INFO("--plan chose: {}", j["describe"].get<std::string>());
  return layout;
}

}  // namespace torus::plan
