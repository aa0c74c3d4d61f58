// Command-line options of the randomized collective test (random_options.h).
#include "random_options.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "../../bench/common/cli.h"  // the shared command line (header-only)
#include "random_cases.h"

namespace torus::comm::rc {
namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "torus_random_collectives: %s\n"
               "usage: torus_random_collectives [--seed N] [--cases N] [--first N] [--max-bytes N[K|M]]\n"
               "  [--deadline-ms N] [--exclude LIST] [--hosts SPEC] [--sync-every N] [--max-splits N]\n"
               "  [--inject KIND@CASE,...] [--verbose]   (see the top of random_collectives.cpp)\n",
               why.c_str());
  std::exit(2);
}

uint64_t parse_uint(const std::string& name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  uint64_t mult = 1;
  if (end && (*end == 'K' || *end == 'k')) mult = 1024, ++end;
  if (end && (*end == 'M' || *end == 'm')) mult = 1024 * 1024, ++end;
  if (errno || v.empty() || v[0] == '-' || !end || *end) usage("bad value for " + name + ": '" + v + "'");
  return x * mult;
}

const std::set<std::string>& family_names() {
  static const std::set<std::string> names = [] {
    std::set<std::string> s = {"batch", "split", "a2a-mixed-equal", "half-multi-host"};
    for (int k = 0; k < kNumKinds; ++k) s.insert(std::string(kind_name(static_cast<Kind>(k))));
    for (DType t : kAllDTypes) s.insert(std::string(dtype_name(t)));
    return s;
  }();
  return names;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  bench::Cli cli;
  cli.flag("--help,-h", [] { usage("randomized collective test"); });
  cli.flag("--verbose", [&] { o.verbose = true; });
  cli.option("--seed", [&](const std::string& v) { o.seed = parse_uint("--seed", v); });
  cli.option("--cases", [&](const std::string& v) { o.cases = parse_uint("--cases", v); });
  cli.option("--first", [&](const std::string& v) { o.first = parse_uint("--first", v); });
  cli.option("--max-bytes", [&](const std::string& v) { o.max_bytes = parse_uint("--max-bytes", v); });
  cli.option("--deadline-ms",
             [&](const std::string& v) { o.deadline_ms = static_cast<int64_t>(parse_uint("--deadline-ms", v)); });
  cli.option("--sync-every", [&](const std::string& v) {
    o.sync_every = static_cast<int>(std::max<uint64_t>(1, parse_uint("--sync-every", v)));
  });
  cli.option("--max-splits",
             [&](const std::string& v) { o.max_splits = static_cast<int>(parse_uint("--max-splits", v)); });
  cli.option("--hosts", [&](const std::string& v) { o.hosts = v; });
  cli.option("--exclude", [&](const std::string& v) {
    for (const auto& f : bench::split_list(v)) {
      if (!family_names().count(f)) usage("unknown case family '" + f + "' in --exclude");
      o.exclude.insert(f);
    }
  });
  cli.option("--inject", [&](const std::string& v) {
    for (const auto& item : bench::split_list(v)) {
      auto at = item.find('@');
      if (at == std::string::npos) usage("--inject wants KIND@CASE, got '" + item + "'");
      Injection inj;
      inj.kind = item.substr(0, at);
      inj.at = parse_uint("--inject", item.substr(at + 1));
      static const std::set<std::string> kinds = {"wrong", "clobber", "hang", "error", "unclear", "nonstd"};
      if (!kinds.count(inj.kind)) usage("unknown --inject kind '" + inj.kind + "'");
      o.inject.push_back(inj);
    }
  });
  try {
    cli.parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  if (o.deadline_ms <= 0) usage("--deadline-ms must be > 0");
  return o;
}

std::vector<int> parse_hosts(const std::string& spec, int n) {
  std::vector<int> h;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    const std::string how = spec.substr(0, colon);
    const int k = static_cast<int>(parse_uint("--hosts", spec.substr(colon + 1)));
    if (k < 1) usage("--hosts: at least one host");
    for (int r = 0; r < n; ++r) {
      if (how == "blocks")
        h.push_back(static_cast<int>(static_cast<int64_t>(r) * k / n));
      else if (how == "cyclic")
        h.push_back(r % k);
      else
        usage("--hosts: unknown layout '" + how + "'");
    }
  } else {
    for (const auto& s : bench::split_list(spec)) h.push_back(static_cast<int>(parse_uint("--hosts", s)));
  }
  if (static_cast<int>(h.size()) != n)
    usage(fmt::format("--hosts '{}' gives {} ranks, the world has {}", spec, h.size(), n));
  // Renumber by first appearance, as the bootstrap's host map does.
  std::map<int, int> index;
  for (int& x : h) x = index.emplace(x, static_cast<int>(index.size())).first->second;
  return h;
}

}  // namespace torus::comm::rc
