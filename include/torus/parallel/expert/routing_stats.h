// torus/parallel/expert/routing_stats.h — what a mixture-of-experts layer
// reports about a training step: load per expert, drops, auxiliary losses.
// Free of LibTorch (the metrics writers and the step log read it).
//
// Every figure is over the whole token group of each micro-batch (Note
// [Layout-independent routing] in moe.h), so it is the same on every rank
// and in every layout, and summed over the step's micro-batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torus::ep {

struct LayerRoutingStats {
  int64_t layer = -1;                     // global block index
  std::vector<double> tokens_per_expert;  // assignments chosen per expert, before drops
  double assignments = 0;                 // k x tokens
  double dropped = 0;                     // assignments over capacity
  double aux_loss = 0;                    // sum over micro-batches of E sum_e f_e P_e
  double z_loss = 0;                      // sum over micro-batches of mean lse^2
  int64_t micro_batches = 0;

  double drop_rate() const { return assignments > 0 ? dropped / assignments : 0.0; }
  // max over experts / mean over experts of tokens_per_expert (1: balanced).
  double imbalance() const;
  double mean_aux_loss() const { return micro_batches > 0 ? aux_loss / static_cast<double>(micro_batches) : 0.0; }
  double mean_z_loss() const { return micro_batches > 0 ? z_loss / static_cast<double>(micro_batches) : 0.0; }
};

// A step's statistics of every MoE layer of the model (in layer order).
struct RoutingSummary {
  std::vector<LayerRoutingStats> layers;

  bool empty() const { return layers.empty(); }
  double drop_rate() const;      // over every layer's assignments
  double imbalance() const;      // the largest layer imbalance
  double aux_loss() const;       // mean over layers of the per-micro-batch mean
  double z_loss() const;
  std::vector<double> tokens_per_expert() const;  // summed over layers

  // Fixed-size packing (per layer: E + 5 values) for one reduction over the
  // pipeline ranks; unpack() keeps the layers with micro_batches > 0.
  static std::vector<double> pack(const std::vector<LayerRoutingStats>& layers, int64_t num_layers,
                                  int64_t num_experts);
  static RoutingSummary unpack(const std::vector<double>& packed, int64_t num_layers, int64_t num_experts);
};

}  // namespace torus::ep
