// Routing statistics of MoE layers (routing_stats.h).
#include "torus/parallel/expert/routing_stats.h"

#include <algorithm>
#include <numeric>

namespace torus::ep {

double LayerRoutingStats::imbalance() const {
  if (tokens_per_expert.empty()) return 0.0;
  const double total = std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), 0.0);
  if (total <= 0) return 0.0;
  const double mean = total / static_cast<double>(tokens_per_expert.size());
  return *std::max_element(tokens_per_expert.begin(), tokens_per_expert.end()) / mean;
}

double RoutingSummary::drop_rate() const {
  double dropped = 0, all = 0;
  for (const auto& l : layers) {
    dropped += l.dropped;
    all += l.assignments;
  }
  return all > 0 ? dropped / all : 0.0;
}

double RoutingSummary::imbalance() const {
  double m = 0;
  for (const auto& l : layers) m = std::max(m, l.imbalance());
  return m;
}

double RoutingSummary::aux_loss() const {
  if (layers.empty()) return 0.0;
  double s = 0;
  for (const auto& l : layers) s += l.mean_aux_loss();
  return s / static_cast<double>(layers.size());
}

double RoutingSummary::z_loss() const {
  if (layers.empty()) return 0.0;
  double s = 0;
  for (const auto& l : layers) s += l.mean_z_loss();
  return s / static_cast<double>(layers.size());
}

std::vector<double> RoutingSummary::tokens_per_expert() const {
  std::vector<double> out;
  for (const auto& l : layers) {
    if (out.size() < l.tokens_per_expert.size()) out.resize(l.tokens_per_expert.size(), 0.0);
    for (size_t e = 0; e < l.tokens_per_expert.size(); ++e) out[e] += l.tokens_per_expert[e];
  }
  return out;
}

std::vector<double> RoutingSummary::pack(const std::vector<LayerRoutingStats>& layers, int64_t num_layers,
                                         int64_t num_experts) {
  const int64_t width = num_experts + 5;
  std::vector<double> out(static_cast<size_t>(num_layers * width), 0.0);
  for (const auto& l : layers) {
    if (l.layer < 0 || l.layer >= num_layers) continue;
    double* row = out.data() + l.layer * width;
    for (int64_t e = 0; e < num_experts && e < static_cast<int64_t>(l.tokens_per_expert.size()); ++e) {
      row[e] = l.tokens_per_expert[e];
    }
    row[num_experts] = l.assignments;
    row[num_experts + 1] = l.dropped;
    row[num_experts + 2] = l.aux_loss;
    row[num_experts + 3] = l.z_loss;
    row[num_experts + 4] = static_cast<double>(l.micro_batches);
  }
  return out;
}

RoutingSummary RoutingSummary::unpack(const std::vector<double>& packed, int64_t num_layers, int64_t num_experts) {
  RoutingSummary s;
  const int64_t width = num_experts + 5;
  for (int64_t layer = 0; layer < num_layers && (layer + 1) * width <= static_cast<int64_t>(packed.size()); ++layer) {
    const double* row = packed.data() + layer * width;
    if (row[num_experts + 4] <= 0) continue;
    LayerRoutingStats l;
    l.layer = layer;
    l.tokens_per_expert.assign(row, row + num_experts);
    l.assignments = row[num_experts];
    l.dropped = row[num_experts + 1];
    l.aux_loss = row[num_experts + 2];
    l.z_loss = row[num_experts + 3];
    l.micro_batches = static_cast<int64_t>(row[num_experts + 4] + 0.5);
    s.layers.push_back(std::move(l));
  }
  return s;
}

}  // namespace torus::ep
