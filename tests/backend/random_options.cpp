// Command-line options of the randomized collective test (random_options.h).
#include "random_options.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>

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

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
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
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    if (a == "--help" || a == "-h") usage("randomized collective test");
    if (a == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (auto eq = a.find('='); eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else {
      if (i + 1 >= argc) usage("missing value for " + a);
      v = argv[++i];
    }
    if (a == "--seed")
      o.seed = parse_uint(a, v);
    else if (a == "--cases")
      o.cases = parse_uint(a, v);
    else if (a == "--first")
      o.first = parse_uint(a, v);
    else if (a == "--max-bytes")
      o.max_bytes = parse_uint(a, v);
    else if (a == "--deadline-ms")
      o.deadline_ms = static_cast<int64_t>(parse_uint(a, v));
    else if (a == "--sync-every")
      o.sync_every = static_cast<int>(std::max<uint64_t>(1, parse_uint(a, v)));
    else if (a == "--max-splits")
      o.max_splits = static_cast<int>(parse_uint(a, v));
    else if (a == "--hosts")
      o.hosts = v;
    else if (a == "--exclude") {
      for (const auto& f : split_list(v)) {
        if (!family_names().count(f)) usage("unknown case family '" + f + "' in --exclude");
        o.exclude.insert(f);
      }
    } else if (a == "--inject") {
      for (const auto& item : split_list(v)) {
        auto at = item.find('@');
        if (at == std::string::npos) usage("--inject wants KIND@CASE, got '" + item + "'");
        Injection inj;
        inj.kind = item.substr(0, at);
        inj.at = parse_uint(a, item.substr(at + 1));
        static const std::set<std::string> kinds = {"wrong", "clobber", "hang", "error", "unclear", "nonstd"};
        if (!kinds.count(inj.kind)) usage("unknown --inject kind '" + inj.kind + "'");
        o.inject.push_back(inj);
      }
    } else {
      usage("unknown option " + a);
    }
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
    for (const auto& s : split_list(spec)) h.push_back(static_cast<int>(parse_uint("--hosts", s)));
  }
  if (static_cast<int>(h.size()) != n)
    usage(fmt::format("--hosts '{}' gives {} ranks, the world has {}", spec, h.size(), n));
  // Renumber by first appearance, as the bootstrap's host map does.
  std::map<int, int> index;
  for (int& x : h) x = index.emplace(x, static_cast<int>(index.size())).first->second;
  return h;
}

}  // namespace torus::comm::rc
