// torus/parallel/pipeline/partition.h — cutting a layered model into
// pipeline stages.
//
// A model is a sequence of items (e.g. GPT: embedding, block 0 .. L-1, head)
// with a cost each. A partition gives every stage a contiguous, non-empty run
// of items, in order: stage 0 starts with the first item, the last stage ends
// with the last. partition_balanced() picks the cut that minimises the cost
// of the most expensive stage (the pipeline's clock), breaking ties toward
// the earliest cut points so the result is the same on every rank.
// Plain data, free of LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torus::pp {

// Item ranges of the stages: stage s holds items [bounds[s], bounds[s+1]).
// bounds.size() == num_stages + 1, bounds.front() == 0, bounds.back() == n.
struct Partition {
  std::vector<int64_t> bounds;

  int num_stages() const { return static_cast<int>(bounds.size()) - 1; }
  int64_t begin(int stage) const { return bounds.at(stage); }
  int64_t end(int stage) const { return bounds.at(stage + 1); }
  int64_t size(int stage) const { return end(stage) - begin(stage); }
  // "[0,3) [3,5) [5,8)".
  std::string describe() const;
};

// The contiguous partition of `costs` (each >= 0) into `num_stages`
// non-empty stages that minimises the maximum stage cost (exact, O(S n^2)).
// Throws InvalidArgument when num_stages < 1, num_stages > costs.size(), or
// a cost is negative or not finite.
Partition partition_balanced(const std::vector<double>& costs, int num_stages);

// The partition with the given item counts per stage (each >= 1, summing to
// num_items). Throws InvalidArgument naming the stage or the sum otherwise.
Partition partition_from_sizes(const std::vector<int64_t>& sizes, int64_t num_items);

// Max over stages of the summed cost, and that max over the mean stage cost
// (1.0 is perfectly balanced).
double max_stage_cost(const Partition& partition, const std::vector<double>& costs);
double imbalance(const Partition& partition, const std::vector<double>& costs);

}  // namespace torus::pp
