// The memory estimate and pre-check of a training run (memory_plan.h).
//
// The per-rank parameter counts and activations come from the model seam
// (Model::memory_shape); a model that gives none is estimated from
// num_parameters() alone (Note [Memory estimate]).
#include "torus/engine/memory_plan.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/log.h"
#include "torus/core/error.h"
#include "torus/device/device.h"
#include "torus/core/format.h"
#include "torus/engine/model.h"

namespace torus::engine {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(double v) { return static_cast<int64_t>(std::ceil(v)); }

// What one pipeline rank holds (parameters by count, activations by bytes).
struct RankShape {
  int64_t block_params = 0;    // Ψ_b: the rank's blocks' parameters (its TP shard)
  int64_t outside_params = 0;  // Ψ_o: embeddings, final norm, head (its TP shard)
  int64_t blocks = 0;          // blocks on the rank
  int64_t largest_block = 0;   // parameters of one block (TP shard): a ZeRO-3 unit
  int64_t activations = 0;
};

// Micro-batches (in units of the whole rank's activations) that pipeline
// rank r holds at once at its peak.
double alive_micro_batches(const ParallelLayout& l, int r) {
  const int m = l.num_micro, pp = l.pp, v = l.num_chunks;
  switch (l.schedule) {
    case pp::ScheduleKind::kGPipe:
      return m;
    case pp::ScheduleKind::kInterleaved1F1B: {
      // Megatron's interleaved warm-up: (pp - r - 1) x 2 + (v - 1) x pp
      // chunk forwards, plus the one in flight; each chunk is 1 / v of the
      // rank's blocks.
      const int64_t chunks_alive =
          std::min<int64_t>(int64_t{m} * v, int64_t{pp - r - 1} * 2 + int64_t{v - 1} * pp + 1);
      return static_cast<double>(chunks_alive) / v;
    }
    case pp::ScheduleKind::k1F1B:
    case pp::ScheduleKind::kZeroBubbleH1:
      break;
  }
  return std::min(m, pp - r);
}

bool is_half(c10::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

}  // namespace

std::string MemoryEstimate::describe() const {
  std::string s = fmt::format("parameters {}, gradients {}, optimizer {}, activations {}, buffers {}: {}",
                              format_bytes(parameters), format_bytes(gradients), format_bytes(optimizer),
                              format_bytes(activations), format_bytes(buffers), format_bytes(device_bytes()));
  if (host_bytes() > 0) {
    s += fmt::format("; host (offload): optimizer {}, parameters {}: {}", format_bytes(host_optimizer),
                     format_bytes(host_parameters), format_bytes(host_bytes()));
  }
  return s;
}

MemoryEstimate estimate_memory(const Model& model, const ParallelLayout& layout, const TrainerOptions& options,
                               int64_t micro_batch_rows, int64_t seq_len, const OptimizerConfig& optim) {
  TORUS_CHECK(layout.tp >= 1 && layout.pp >= 1 && layout.dp >= 1 && layout.num_micro >= 1 && layout.num_chunks >= 1,
              InvalidArgument, "estimate_memory: the layout needs sizes >= 1 ({})", layout.describe());
  TORUS_CHECK(micro_batch_rows >= 1 && seq_len >= 1, InvalidArgument,
              "estimate_memory: micro-batch rows and sequence length must be >= 1, got {} and {}", micro_batch_rows,
              seq_len);
  const ModelLayout model_layout{layout.tp, layout.sequence_parallel, layout.num_stages(), layout.layers_per_stage,
                                 layout.ep};
  return estimate_memory_from_shapes(model.memory_shape(model_layout, layout.num_chunks, micro_batch_rows, seq_len),
                                     model.num_parameters(), model.param_dtype(), layout, options, optim);
}

MemoryEstimate estimate_memory_from_shapes(const std::vector<RankMemoryShape>& shapes, int64_t num_parameters,
                                           c10::ScalarType dtype, const ParallelLayout& layout,
                                           const TrainerOptions& options, const OptimizerConfig& optim) {
  TORUS_CHECK(layout.tp >= 1 && layout.pp >= 1 && layout.dp >= 1 && layout.num_micro >= 1 && layout.num_chunks >= 1,
              InvalidArgument, "estimate_memory: the layout needs sizes >= 1 ({})", layout.describe());
  layout.check();
  const int64_t P = static_cast<int64_t>(c10::elementSize(dtype));
  const bool half = is_half(dtype);
  const int64_t G = half && !options.grads_in_param_dtype ? 4 : P;
  const int64_t state_bytes = half ? 4 : P;
  const int64_t states = optim.name == "sgd" ? (optim.momentum > 0 ? 1 : 0) : 2;  // adam, adamw: m and v
  const int64_t K = (half ? 4 : 0) + states * state_bytes;
  const int64_t N = layout.dp;
  const int stage = layout.zero;
  const double act_scale = (options.autocast ? 2.0 : static_cast<double>(P)) / 2.0;

  std::vector<RankShape> ranks;
  for (size_t r = 0; r < shapes.size(); ++r) {
    const RankMemoryShape& ms = shapes[r];
    RankShape rs;
    rs.blocks = ms.blocks;
    rs.block_params = ms.block_params;
    rs.largest_block = ms.largest_block;
    rs.outside_params = ms.outside_params;
    const double alive = alive_micro_batches(layout, static_cast<int>(r));
    rs.activations = round_up((alive * ms.activations_16 + ms.recompute_extra_16) * act_scale + alive * ms.head_bytes);
    ranks.push_back(rs);
  }
  if (ranks.empty()) {
    // Nothing finer than the parameter count: an even share, one unit.
    RankShape rs;
    rs.block_params = ceil_div(num_parameters, int64_t{layout.pp} * layout.tp);
    rs.blocks = 1;
    rs.largest_block = rs.block_params;
    ranks.push_back(rs);
  }

  MemoryEstimate best;
  bool first = true;
  for (const RankShape& rs : ranks) {
    const int64_t psi = rs.block_params + rs.outside_params;
    MemoryEstimate e;
    e.parameters = P * psi;
    e.gradients = G * psi;
    const int64_t optimizer = K * (stage >= 1 ? ceil_div(psi, N) : psi);
    if (stage >= 2) e.gradients = G * ceil_div(psi, N);
    if (stage >= 3) {
      // Block shards; parameters outside blocks stay gathered.
      const int64_t shards = P * ceil_div(rs.block_params, N);
      e.parameters = P * rs.outside_params;
      if (layout.offload == dp::Offload::kOptimizerAndParams) {
        e.host_parameters = shards;
      } else {
        e.parameters += shards;
      }
      e.buffers += P * rs.largest_block * std::min<int64_t>(1 + options.zero_prefetch, rs.blocks);
    }
    if (stage >= 2) e.buffers += G * rs.largest_block * std::min<int64_t>(2, rs.blocks);
    // Stage 1 keeps the reduced gradient shard beside the full gradient.
    if (stage == 1) e.buffers += G * ceil_div(psi, N);
    if (layout.offload == dp::Offload::kNone) {
      e.optimizer = optimizer;
    } else {
      e.host_optimizer = optimizer;
    }
    e.activations = rs.activations;
    const int64_t total = e.device_bytes() + e.host_bytes();
    if (first || total > best.device_bytes() + best.host_bytes()) best = e;
    first = false;
  }
  return best;
}

int64_t parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = -1;
    std::string unit;
    fields >> kib >> unit;
    if (kib < 0) return -1;
    return unit == "kB" || unit.empty() ? kib * 1024 : kib;
  }
  return -1;
}

MemoryBudget available_memory_per_rank(const c10::Device& device, int local_size) {
  const int local = std::max(1, local_size);
  std::ifstream in("/proc/meminfo");
  TORUS_CHECK(in.good(), Error, "memory pre-check: cannot read /proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  const int64_t avail = parse_mem_available(text.str());
  TORUS_CHECK(avail >= 0, Error, "memory pre-check: no MemAvailable in /proc/meminfo");
  MemoryBudget b;
  b.host = avail / local;
  if (device.is_cuda()) {
    const auto props = device::get_device(DeviceType::kCUDA).properties(std::max<int>(0, device.index()));
    b.device = static_cast<int64_t>(props.total_memory);
    b.device_is_host = false;
  } else {
    b.device = b.host;
    b.device_is_host = true;
  }
  return b;
}

bool check_memory(const MemoryEstimate& e, const MemoryBudget& available, bool force) {
  std::string problem;
  if (available.device_is_host) {
    const int64_t need = e.device_bytes() + e.host_bytes();
    if (need > available.device) {
      problem = fmt::format("the run needs about {} per rank ({}) but a rank has {} of host memory (MemAvailable / "
                            "ranks on this host)",
                            format_bytes(need), e.describe(), format_bytes(available.device));
    }
  } else {
    if (e.device_bytes() > available.device) {
      problem = fmt::format("the run needs about {} of device memory per rank ({}) but a device has {}",
                            format_bytes(e.device_bytes()), e.describe(), format_bytes(available.device));
    } else if (e.host_bytes() > available.host) {
      problem = fmt::format("the offloaded state needs about {} of host memory per rank ({}) but a rank has {} "
                            "(MemAvailable / ranks on this host)",
                            format_bytes(e.host_bytes()), e.describe(), format_bytes(available.host));
    }
  }
  if (problem.empty()) return true;
  if (force) {
    TORUS_LOG_WARN("memory pre-check: {}; starting anyway (--force)", problem);
    return false;
  }
  throw InvalidArgument(fmt::format(
      "memory pre-check: {}. Shard over data parallelism with --zero 1 (optimizer state), --zero 2 (+ gradients) or "
      "--zero 3 (+ parameters), move optimizer state to host memory with --offload optimizer, use more "
      "--micro-batches or --recompute full for activations, or start anyway with --force",
      problem));
}

}  // namespace torus::engine
