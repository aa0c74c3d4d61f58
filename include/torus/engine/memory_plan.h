// torus/engine/memory_plan.h — what a training run will keep in memory per
// rank, estimated before anything is allocated, and the pre-check that
// refuses a layout that does not fit.
//
//   MemoryEstimate e = estimate_memory(*model, layout, options, rows, seq, optim);
//   MemoryBudget avail = available_memory_per_rank(model->device(), local_size);
//   check_memory(e, avail, /*force=*/cfg.force);   // InvalidArgument when it does not fit
//
// TrainLoop runs the check after the model adapter is made and before the
// Trainer allocates anything, with no communication (docs/engine.md,
// "The memory pre-check").
//
// Note [Memory estimate]: bytes per rank by kind — those of the pipeline
// rank with the most bytes in all, so the same estimate on every rank — with
//   Ψ  = the parameters of this rank's stages: for the reference GPT the
//        blocks of the rank's stages (the explicit cut, or ceil(L / stages)
//        blocks per stage) / tp, plus every parameter outside the blocks
//        (embeddings, final norm, head) / tp — outside parameters are
//        counted on every pipeline rank (an upper bound, exact at pp = 1);
//        for any other model num_parameters() / (pp x tp);
//   N  = dp; P = bytes of the parameter dtype;
//   G  = bytes of a gradient: 4 (f32 main gradients) for bf16/f16
//        parameters, P with grads_in_param_dtype or for f32/f64 parameters;
//   K  = optimizer bytes per parameter: 4 for the fp32 master of a half
//        parameter, plus per state tensor (Adam: m and v; SGD with momentum:
//        the buffer; plain SGD: none) 4 bytes for half parameters, P
//        otherwise — Adam 12 on bf16, 8 on f32; SGD with momentum 8 on bf16,
//        4 on f32.
//
//   ZeRO stage   parameters      gradients   optimizer
//   0            P Ψ             G Ψ         K Ψ
//   1            P Ψ             G Ψ         K Ψ / N
//   2            P Ψ             G Ψ / N     K Ψ / N
//   3            P Ψ_b / N + P Ψ_o   G Ψ / N     K Ψ / N
// (Ψ_b: block parameters, Ψ_o: parameters outside blocks, which ZeRO-3
// keeps gathered; for a model other than the GPT Ψ_o = 0. Divisions round
// up.) With --offload optimizer the optimizer bytes are host memory, not
// device memory; with optimizer+params the ZeRO-3 parameter shards (P Ψ_b /
// N) too. On a CPU run host and device are the same memory and all of it
// counts.
//
// Activations (the reference GPT; 0 for other models), per block and
// micro-batch of b rows and s tokens, hidden h, a heads, t = tp, after
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"), bytes at 16-bit activations:
//   no TP, or TP with SP:  s b h (34 + 5 a s / h) / t
//   TP without SP:         s b h (10 + 24 / t + 5 a s / (h t))
//   selective recompute:   the same without the 5 a s / h attention term
//   full recompute:        2 s b h / t (with SP; 2 s b h without) — the
//                          block input — plus one block's full activations
//                          for the recompute in backward
//   every:K:               the blocks of the stage whose global index is a
//                          multiple of K as full, the others as none
// scaled by A / 2 for activations of A bytes (the parameter dtype; 2 under
// autocast). The output layer adds 8 s b V / t (f32 logits and their
// gradient; V the vocabulary). These are multiplied by the micro-batches a
// pipeline rank holds at once — GPipe: num_micro; 1F1B and ZB-H1: min(pp,
// num_micro) (the first stage); interleaved: min(num_micro, pp + ceil((pp -
// 1) / chunks)) — the most any rank holds, so an upper bound for the others.
//
// Buffers: stage 1 keeps the reduced gradient shard (G Ψ / N) beside the
// full gradient it accumulates into; stage 3 gathers one block's parameters (P x the block's
// parameters / t) for the running block and each prefetched one: (1 +
// zero_prefetch) of them; stages 2-3 hold transient full gradient buffers of
// up to 2 blocks (ZeroOptions::max_inflight) at G bytes. DDP's buckets are
// the gradients themselves (their views), so stage 0 adds nothing.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "torus/engine/trainer.h"

namespace torus::engine {

class Model;

struct MemoryEstimate {
  // Device memory (the host's on a CPU run).
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;  // fp32 masters and optimizer state
  int64_t activations = 0;
  int64_t buffers = 0;  // ZeRO-3 gathered blocks, ZeRO-2/3 transient gradient buffers
  // Host memory of the offloaded parts (--offload).
  int64_t host_optimizer = 0;
  int64_t host_parameters = 0;

  int64_t device_bytes() const { return parameters + gradients + optimizer + activations + buffers; }
  int64_t host_bytes() const { return host_optimizer + host_parameters; }
  // "parameters 1.2 MiB, gradients 2.4 MiB, optimizer 3.6 MiB, activations
  // 8.0 MiB, buffers 0 B: 15.2 MiB" (+ "; host: optimizer 3.6 MiB" with
  // offload).
  std::string describe() const;
};

// Per-rank bytes of a run of `model` laid out as `layout`, with
// micro-batches of `micro_batch_rows` rows of `seq_len` tokens (Note
// [Memory estimate]). Pure: allocates nothing, no communication.
MemoryEstimate estimate_memory(const Model& model, const ParallelLayout& layout, const TrainerOptions& options,
                               int64_t micro_batch_rows, int64_t seq_len, const OptimizerConfig& optim = {});
// The same from what the model says (Model::memory_shape; empty: nothing
// finer than `num_parameters`, an even share over pp x tp in one unit, no
// activations): what estimate_memory computes once it has asked the model,
// and what the planner's generic (parameter-count) models use.
MemoryEstimate estimate_memory_from_shapes(const std::vector<RankMemoryShape>& shapes, int64_t num_parameters,
                                           c10::ScalarType param_dtype, const ParallelLayout& layout,
                                           const TrainerOptions& options, const OptimizerConfig& optim = {});

// Memory a rank may use.
struct MemoryBudget {
  int64_t device = 0;  // bytes of the device per rank (on CPU: = host)
  int64_t host = 0;    // bytes of host memory per rank
  bool device_is_host = true;  // a CPU run: device and host bytes are one pool
};

// On CUDA the device's total memory (DeviceProperties::total_memory) and
// the host's MemAvailable / local_size; on CPU MemAvailable (/proc/meminfo)
// divided by the ranks on this host (`local_size`). Throws Error when
// /proc/meminfo cannot be read.
MemoryBudget available_memory_per_rank(const c10::Device& device, int local_size);
// MemAvailable of a /proc/meminfo text, in bytes; -1 when absent.
int64_t parse_mem_available(const std::string& meminfo);

// Throws InvalidArgument when the estimate exceeds the budget — the message
// gives the estimate per rank by kind beside the memory available per rank
// and suggests --zero, --offload or --force — unless `force`, which logs a
// warning instead. Returns whether the estimate fits.
bool check_memory(const MemoryEstimate& estimate, const MemoryBudget& available, bool force);

}  // namespace torus::engine
