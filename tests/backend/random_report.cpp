// Rank 0's report of the randomized collective test (random_report.h).
#include "random_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace torus::comm::rc {
namespace {

std::string clean(std::string s, size_t max = 2000) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\t' || ch == '\r') ch = ' ';
  }
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

}  // namespace

std::string serialize(const std::vector<Record>& records, uint64_t ran) {
  std::string s = fmt::format("ran\t{}\n", ran);
  size_t with_text = 0;
  for (const Record& r : records) {
    // Every record counts; the text of the first few hundred travels.
    const bool text = is_failure(r.cat) ? with_text++ < 300 : false;
    s += fmt::format("{}\t{}\t{}\t{}\t{}\n", r.index, static_cast<int>(r.cat), r.unclear ? 1 : 0, r.injected ? 1 : 0,
                     text ? clean(r.msg) : "");
  }
  return s;
}

std::vector<Record> deserialize(const std::string& s, int rank, uint64_t* ran) {
  std::vector<Record> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    std::string line = s.substr(pos, nl - pos);
    pos = nl + 1;
    std::vector<std::string> f;
    size_t p = 0;
    for (int k = 0; k < 4; ++k) {
      size_t t = line.find('\t', p);
      if (t == std::string::npos) break;
      f.push_back(line.substr(p, t - p));
      p = t + 1;
    }
    f.push_back(line.substr(std::min(p, line.size())));
    if (f.size() == 2 && f[0] == "ran") {
      *ran = std::stoull(f[1]);
      continue;
    }
    if (f.size() != 5) continue;
    Record r;
    r.index = std::stoull(f[0]);
    r.cat = static_cast<Cat>(std::stoi(f[1]));
    r.unclear = f[2] == "1";
    r.injected = f[3] == "1";
    r.rank = rank;
    r.msg = f[4];
    out.push_back(std::move(r));
  }
  return out;
}

uint64_t print_report(const ReportContext& ctx, std::vector<Record> all, uint64_t participations, bool* teardown_safe) {
  // A case's outcome is the worst any of its ranks reported; no report: passed.
  struct Outcome {
    Cat cat = Cat::kPass;
    bool unclear = false, injected = false;
  };
  std::map<uint64_t, Outcome> outcome;
  size_t setup_failures = 0, unclear = 0;
  for (const Record& r : all) {
    if (r.cat == Cat::kHang || r.cat == Cat::kError) *teardown_safe = false;
    if (r.index == kSetup) {
      setup_failures += is_failure(r.cat);
      continue;
    }
    Outcome& o = outcome[r.index];
    o.cat = std::max(o.cat, r.cat);
    o.unclear |= r.unclear && is_failure(r.cat);
    o.injected |= r.injected;
  }
  struct Row {
    uint64_t cases = 0, passed = 0, failed = 0, skipped = 0, excluded = 0;
  };
  std::map<std::string, Row> by_kind, by_dtype;
  std::map<Cat, uint64_t> by_cat;
  uint64_t passed = 0, failed = 0;
  for (uint64_t i = ctx.opt.first; i < ctx.opt.first + ctx.opt.cases; ++i) {
    const Case c = ctx.make_case(i);
    const Outcome o = outcome.count(i) ? outcome[i] : Outcome{};
    std::string kind = c.split ? "split" : c.ops.size() > 1 ? "batch" : std::string(kind_name(c.ops[0].kind));
    std::set<std::string> dtypes;
    for (const Op& op : c.ops) {
      if (op.kind != Kind::kBarrier) dtypes.insert(std::string(dtype_name(op.dtype)));
    }
    std::vector<Row*> rows = {&by_kind[kind]};
    for (const auto& d : dtypes) rows.push_back(&by_dtype[d]);
    for (Row* row : rows) {
      ++row->cases;
      if (is_failure(o.cat))
        ++row->failed;
      else if (o.cat == Cat::kSkipped)
        ++row->skipped;
      else if (o.cat == Cat::kExcluded)
        ++row->excluded;
      else
        ++row->passed;
    }
    ++by_cat[o.cat];
    if (is_failure(o.cat)) {
      ++failed;
      unclear += o.unclear;
    } else if (o.cat == Cat::kPass) {
      ++passed;
    }
  }
  failed += setup_failures;

  std::vector<std::string> host_list;
  for (int h : ctx.hosts.host_of_rank) host_list.push_back(std::to_string(h));
  std::printf(
      "random collectives: backend %s, %d ranks on %d host(s) [%s], seed %llu, cases %llu..%llu, max %zu "
      "bytes, deadline %lld ms, %.1f s\n",
      ctx.backend.c_str(), ctx.world_size, ctx.hosts.num_hosts(), fmt::format("{}", fmt::join(host_list, ",")).c_str(),
      static_cast<unsigned long long>(ctx.opt.seed), static_cast<unsigned long long>(ctx.opt.first),
      static_cast<unsigned long long>(ctx.opt.first + ctx.opt.cases - 1), ctx.opt.max_bytes,
      static_cast<long long>(ctx.opt.deadline_ms), ctx.seconds);
  if (!ctx.opt.exclude.empty()) {
    std::printf("  excluded families: %s\n", fmt::format("{}", fmt::join(ctx.opt.exclude, ",")).c_str());
  }
  auto table = [](const char* title, const std::map<std::string, Row>& rows) {
    std::printf("  %-16s %7s %7s %7s %7s %8s\n", title, "cases", "passed", "failed", "skipped", "excluded");
    for (const auto& [k, r] : rows) {
      std::printf("  %-16s %7llu %7llu %7llu %7llu %8llu\n", k.c_str(), static_cast<unsigned long long>(r.cases),
                  static_cast<unsigned long long>(r.passed), static_cast<unsigned long long>(r.failed),
                  static_cast<unsigned long long>(r.skipped), static_cast<unsigned long long>(r.excluded));
    }
  };
  table("op", by_kind);
  table("dtype", by_dtype);
  std::printf(
      "  failed cases by category: wrong %llu, clobber %llu, hangs %llu, errors %llu (unclear messages "
      "%zu); setup failures %zu\n",
      static_cast<unsigned long long>(by_cat[Cat::kWrong]), static_cast<unsigned long long>(by_cat[Cat::kClobber]),
      static_cast<unsigned long long>(by_cat[Cat::kHang]), static_cast<unsigned long long>(by_cat[Cat::kError]),
      unclear, setup_failures);
  std::printf(
      "  not run: skipped %llu (group broken by an earlier failure), excluded %llu; %llu rank-cases run, "
      "%d splits\n",
      static_cast<unsigned long long>(by_cat[Cat::kSkipped]), static_cast<unsigned long long>(by_cat[Cat::kExcluded]),
      static_cast<unsigned long long>(participations), ctx.splits);
  // The failures themselves, the first ones in full.
  std::sort(all.begin(), all.end(),
            [](const Record& a, const Record& b) { return a.index != b.index ? a.index < b.index : a.rank < b.rank; });
  size_t shown = 0, total = 0;
  for (const Record& r : all) {
    if (!is_failure(r.cat)) continue;
    ++total;
    if (shown < 40 && !r.msg.empty()) {
      std::printf("  FAILED [%s] rank %d: %s\n", std::string(cat_name(r.cat)).c_str(), r.rank, r.msg.c_str());
      ++shown;
    }
  }
  if (total > shown)
    std::printf("  ... %zu more failure reports (every rank prints its own to stderr)\n", total - shown);
  if (total > 0) {
    std::printf(
        "  rerun one case K: the same launch (ranks, backend, --hosts) with --seed %llu --max-bytes %zu "
        "--first K --cases 1\n",
        static_cast<unsigned long long>(ctx.opt.seed), ctx.opt.max_bytes);
  }
  if (!ctx.opt.inject.empty()) {
    size_t counted = 0;
    for (const Injection& inj : ctx.opt.inject) {
      const Outcome o = outcome.count(inj.target) ? outcome[inj.target] : Outcome{};
      const Cat want = inj.kind == "wrong"     ? Cat::kWrong
                       : inj.kind == "clobber" ? Cat::kClobber
                       : inj.kind == "hang"    ? Cat::kHang
                                               : Cat::kError;
      const bool ok = inj.target != kSetup && o.injected && o.cat == want &&
                      (inj.kind != "unclear" && inj.kind != "nonstd" ? true : o.unclear);
      counted += ok;
      std::printf("  injected %s@%llu: case %lld on rank %d, counted as %s%s\n", inj.kind.c_str(),
                  static_cast<unsigned long long>(inj.at),
                  inj.target == kSetup ? -1LL : static_cast<long long>(inj.target), inj.rank,
                  std::string(cat_name(o.cat)).c_str(), ok ? "" : " (NOT as injected)");
    }
    std::printf("  injected failures counted: %zu of %zu\n", counted, ctx.opt.inject.size());
  }
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  std::fflush(stdout);
  return failed;
}

}  // namespace torus::comm::rc
