// Rank 0's report of the randomized collective test: every rank's
// outcomes gathered through the Store, counted per case (a case takes the
// worst outcome any of its ranks reported; none: passed), tables per op and
// dtype, the first failures, and the closing "N passed, N failed" line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "random_cases.h"
#include "random_op.h"
#include "random_options.h"
#include "torus/comm/context.h"

namespace torus::comm::rc {

// One outcome other than a pass, as a rank recorded it.
struct Record {
  uint64_t index = 0;
  Cat cat = Cat::kPass;
  bool unclear = false;
  bool injected = false;
  int rank = 0;
  std::string msg;
};

// A rank's records and how many cases it took part in, as text for the
// Store (the messages of the first few hundred failures travel), and back.
std::string serialize(const std::vector<Record>& records, uint64_t ran);
std::vector<Record> deserialize(const std::string& s, int rank, uint64_t* ran);

struct ReportContext {
  const Options& opt;
  std::string backend;
  const HostMap& hosts;
  int world_size = 0;
  double seconds = 0;
  int splits = 0;
  std::function<Case(uint64_t)> make_case;  // case i, as every rank made it
};

// Prints the report to stdout from every rank's records; returns the number
// of failed cases plus setup failures. *teardown_safe becomes false when
// any op timed out or threw (a backend may hold requests that never end).
uint64_t print_report(const ReportContext& ctx, std::vector<Record> all, uint64_t participations, bool* teardown_safe);

}  // namespace torus::comm::rc
