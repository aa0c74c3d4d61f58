// torus-train — trains a byte-level language model (the reference GPT) with
// tensor, sequence, pipeline and data parallelism, launched by mpirun (or
// any launcher Torus bootstraps from).
//
//   mpirun -np 8 torus-train --tp 2 --pp 2 --dp 2 --steps 200
//   torus-train --help
//
// The program is a front end of run::TrainLoop (train_loop.h): the option
// table is run::RunConfig's (run_config.h), the loop, its step line,
// metrics JSONL and TensorBoard files are the library's. docs/train.md
// describes every option.
#include <signal.h>

#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "torus/comm/context.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/core/host_allocator.h"
#include "torus/core/logging.h"
#include "torus/plan/planner.h"
#include "torus/run/run_config.h"
#include "torus/run/train_loop.h"

namespace {

using namespace torus;

int run_main(int argc, char** argv) {
  run::RunConfig cfg;
  if (run::parse_run_config(argc, argv, cfg) == run::ParseOutcome::kHelp) {
    std::cout << run::run_config_help(
        "torus-train",
        "Trains a byte-level GPT language model with tensor (--tp), pipeline (--pp) and data (--dp) parallelism.\n"
        "Launch one process per rank, e.g.: mpirun -np 8 torus-train --tp 2 --pp 2 --dp 2");
    return 0;
  }
  cfg.validate();  // before any communication
  // Every step frees and re-allocates the same large buffers: keep them in
  // the process instead of faulting fresh pages in (core/host_allocator.h).
  retain_freed_host_memory();
  comm::ProcessGroupPtr world = torus::init();
  try {
    if (cfg.plan) {  // the planner above the run chooses the layout (plan/planner.h)
      cfg.layout = plan::plan_layout(world, cfg);
      cfg.plan = false;
    }
    run::TrainLoop loop(world, cfg, "torus-train");
    loop.set_line_sink([](std::string_view line) {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    });
    const int rank = world->rank();
    if (cfg.fail_rank >= 0) {
      loop.on_step_begin([&cfg, rank](int64_t step) {
        if (rank == cfg.fail_rank && step == cfg.fail_step) {
          log_message(LogLevel::kWarn, fmt::format("torus-train: --fail-rank {} --fail-step {}: killing this rank",
                                                   cfg.fail_rank, cfg.fail_step));
          ::raise(SIGKILL);
        }
      });
    }
    loop.run();
    return 0;
  } catch (const Error&) {
    // A dead or stuck peer: do not wait for it to check out at shutdown.
    world->context()->mark_failed();
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const torus::InvalidArgument& e) {
    std::fprintf(stderr, "torus-train: error: %s\n(see torus-train --help)\n", e.what());
    return 2;
  } catch (const torus::Error& e) {
    std::fprintf(stderr, "torus-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-train: error: %s\n", e.what());
    return 1;
  }
}
