// Command-line options of the randomized collective test (see the top of
// random_collectives.cpp for their meaning).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace torus::comm::rc {

inline constexpr uint64_t kSetup = UINT64_MAX;  // the case index of setup failures

struct Injection {
  std::string kind;
  uint64_t at = 0;
  uint64_t target = kSetup;  // the case it lands in
  int rank = -1;             // world rank that fakes it
};

struct Options {
  uint64_t seed = 1, first = 0, cases = 200;
  size_t max_bytes = size_t{1} << 20;
  int64_t deadline_ms = 30000;
  int sync_every = 25, max_splits = 200, random_partitions = 6;
  std::string hosts;
  std::set<std::string> exclude;
  std::vector<Injection> inject;
  bool verbose = false;
};

// Parses argv; prints usage and exits with status 2 on a bad option.
Options parse_options(int argc, char** argv);

// The host of each of n ranks from --hosts ("0,0,1", "blocks:H",
// "cyclic:H"), numbered by first appearance.
std::vector<int> parse_hosts(const std::string& spec, int n);

}  // namespace torus::comm::rc
