#include "torus/parallel/pipeline/partition.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "torus/core/error.h"

namespace torus::pp {

std::string Partition::describe() const {
  std::string out;
  for (int s = 0; s < num_stages(); ++s) {
    if (s) out += ' ';
    out += '[' + std::to_string(begin(s)) + ',' + std::to_string(end(s)) + ')';
  }
  return out;
}

Partition partition_balanced(const std::vector<double>& costs, int num_stages) {
  const int64_t n = static_cast<int64_t>(costs.size());
  if (num_stages < 1) throw InvalidArgument("partition_balanced: num_stages must be >= 1, got " + std::to_string(num_stages));
  if (num_stages > n) {
    throw InvalidArgument("partition_balanced: cannot cut " + std::to_string(n) + " items into " +
                          std::to_string(num_stages) + " non-empty stages");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      throw InvalidArgument("partition_balanced: cost of item " + std::to_string(i) + " is " +
                            std::to_string(costs[i]) + " (must be finite and >= 0)");
    }
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: minimal max-stage cost of items [0, i) in s stages; cut[s][i]: where stage s-1 begins.
  std::vector<std::vector<double>> best(num_stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(num_stages + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0.0;
  for (int s = 1; s <= num_stages; ++s) {
    for (int64_t i = s; i <= n - (num_stages - s); ++i) {
      for (int64_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        const double v = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        // Strictly smaller only: ties keep the earliest cut (deterministic).
        if (v < best[s][i] - 1e-12 * std::max(1.0, std::abs(v))) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
    }
  }
  Partition p;
  p.bounds.assign(num_stages + 1, 0);
  p.bounds[num_stages] = n;
  int64_t i = n;
  for (int s = num_stages; s >= 1; --s) {
    i = cut[s][i];
    p.bounds[s - 1] = i;
  }
  return p;
}

Partition partition_from_sizes(const std::vector<int64_t>& sizes, int64_t num_items) {
  if (sizes.empty()) throw InvalidArgument("partition_from_sizes: no stages given");
  Partition p;
  p.bounds.push_back(0);
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (sizes[s] < 1) {
      throw InvalidArgument("partition_from_sizes: stage " + std::to_string(s) + " has " + std::to_string(sizes[s]) +
                            " items (each stage needs at least 1)");
    }
    p.bounds.push_back(p.bounds.back() + sizes[s]);
  }
  if (p.bounds.back() != num_items) {
    throw InvalidArgument("partition_from_sizes: the stage sizes sum to " + std::to_string(p.bounds.back()) +
                          ", the model has " + std::to_string(num_items) + " items");
  }
  return p;
}

double max_stage_cost(const Partition& partition, const std::vector<double>& costs) {
  double worst = 0;
  for (int s = 0; s < partition.num_stages(); ++s) {
    double c = 0;
    for (int64_t i = partition.begin(s); i < partition.end(s); ++i) c += costs.at(i);
    worst = std::max(worst, c);
  }
  return worst;
}

double imbalance(const Partition& partition, const std::vector<double>& costs) {
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  if (total <= 0) return 1.0;
  return max_stage_cost(partition, costs) / (total / partition.num_stages());
}

}  // namespace torus::pp
