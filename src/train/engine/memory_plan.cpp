// The memory estimate and pre-check of a training run (memory_plan.h).
//
// The activation formula and the per-stage parameter counts are those of the
// reference GPT (its config: blocks, widths, the pipeline cut); any other
// model is estimated from num_parameters() alone (Note [Memory estimate]).
// When the model seam grows a per-stage memory description this file should
// read it instead of the GPT adapter's config.
#include "torus/train/memory_plan.h"

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
#include "torus/models/gpt.h"
#include "torus/train/gpt_model.h"
#include "torus/train/metrics.h"
#include "torus/train/model.h"

namespace torus::train {
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

// Bytes of one block's activations for one micro-batch at 16-bit, after
// Korthikanti et al. 2022; `attention`: include the 5 a s / h term.
double block_activation_16(int64_t s, int64_t b, int64_t h, int64_t a, int t, bool sp, bool attention) {
  const double sbh = static_cast<double>(s) * b * h;
  const double att = attention ? 5.0 * a * s / h : 0.0;
  if (t == 1 || sp) return sbh * (34.0 + att) / t;
  return sbh * (10.0 + 24.0 / t + att / t);
}

std::vector<RankShape> gpt_ranks(const models::GPTConfig& g, const ParallelLayout& l, int64_t rows, int64_t seq,
                                 double act_scale) {
  const int t = l.tp;
  const int64_t h = g.hidden, f = g.ffn(), V = g.vocab_size;
  // The parameter counts of GPTModel::num_parameters(), per piece.
  const int64_t block = ceil_div(4 * h * h + 2 * h * f + 8 * h + f, t);
  const int64_t embedding = ceil_div(V * h, t) + g.max_seq_len * h;
  const int64_t word = ceil_div(V * h, t);
  const auto parts = models::gpt_stage_parts(g, l.num_stages(), g.max_seq_len, l.layers_per_stage);

  const double full16 = block_activation_16(seq, rows, h, g.num_heads, t, l.sequence_parallel, true);
  const double selective16 = block_activation_16(seq, rows, h, g.num_heads, t, l.sequence_parallel, false);
  const double input16 = 2.0 * seq * rows * h / (l.sequence_parallel ? t : 1);
  const double logits = 8.0 * seq * rows * static_cast<double>(ceil_div(V, t));  // f32 logits and their gradient

  std::vector<RankShape> ranks(l.pp);
  for (int r = 0; r < l.pp; ++r) {
    RankShape& rs = ranks[r];
    double per_micro = 0;   // bytes at 16-bit of one micro-batch through the rank's blocks
    bool recomputes = false;
    bool head = false;
    for (int c = 0; c < l.num_chunks; ++c) {
      const models::GPTPart& p = parts[static_cast<size_t>(c) * l.pp + r];
      const int64_t n = p.num_layers < 0 ? g.num_layers - p.first_layer : p.num_layers;
      rs.blocks += n;
      if (p.embedding) rs.outside_params += embedding;
      if (p.head) {
        head = true;
        rs.outside_params += 2 * h;
        // The head's weight: its own when untied; a copy of the word
        // embedding when tied and the embedding is on another stage.
        if (!g.tie_embeddings || !p.embedding) rs.outside_params += word;
      }
      for (int64_t i = p.first_layer; i < p.first_layer + n; ++i) {
        if (g.recompute.recompute_block(i)) {
          per_micro += input16;
          recomputes = true;
        } else if (g.recompute.recompute_attention_core()) {
          per_micro += selective16;
        } else {
          per_micro += full16;
        }
      }
    }
    rs.block_params = rs.blocks * block;
    rs.largest_block = rs.blocks > 0 ? block : 0;
    const double alive = alive_micro_batches(l, r);
    double bytes = alive * per_micro;
    if (recomputes) bytes += full16;  // one block recomputed in backward
    bytes *= act_scale;
    if (head) bytes += alive * logits;
    rs.activations = round_up(bytes);
  }
  return ranks;
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
  TORUS_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3, InvalidArgument,
              "estimate_memory: ZeRO stage must be 0..3, got {}", options.zero_stage);
  const c10::ScalarType dtype = model.param_dtype();
  const int64_t P = static_cast<int64_t>(c10::elementSize(dtype));
  const bool half = is_half(dtype);
  const int64_t G = half && !options.grads_in_param_dtype ? 4 : P;
  const int64_t state_bytes = half ? 4 : P;
  const int64_t states = optim.name == "sgd" ? (optim.momentum > 0 ? 1 : 0) : 2;  // adam, adamw: m and v
  const int64_t K = (half ? 4 : 0) + states * state_bytes;
  const int64_t N = layout.dp;
  const int stage = options.zero_stage;
  const double act_scale = (options.autocast ? 2.0 : static_cast<double>(P)) / 2.0;

  std::vector<RankShape> ranks;
  if (const auto* gpt = dynamic_cast<const GPTModel*>(&model)) {
    ranks = gpt_ranks(gpt->config(), layout, micro_batch_rows, seq_len, act_scale);
  } else {
    // Nothing finer than the parameter count: an even share, one unit.
    RankShape rs;
    rs.block_params = ceil_div(model.num_parameters(), int64_t{layout.pp} * layout.tp);
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
      if (options.offload == dp::Offload::kOptimizerAndParams) {
        e.host_parameters = shards;
      } else {
        e.parameters += shards;
      }
      e.buffers += P * rs.largest_block * std::min<int64_t>(1 + options.zero_prefetch, rs.blocks);
    }
    if (stage >= 2) e.buffers += G * rs.largest_block * std::min<int64_t>(2, rs.blocks);
    if (options.offload == dp::Offload::kNone) {
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

}  // namespace torus::train
