// bench/common/report.cpp — nccl-tests table and JSON records (report.h).
#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "sweep.h"

namespace torus::bench {
namespace {

// Keeps the non-finite values JSON cannot hold out of the file.
nlohmann::ordered_json json_number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

void print_cells(std::FILE* out, const std::optional<Record>& r) {
  if (!r) {
    std::fprintf(out, "  %9s  %7s  %7s  %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  // Two decimals while they fit the column (as nccl-tests), none beyond.
  std::fprintf(out, "  %9.*f  %7.2f  %7.2f", r->time_us < 1e5 ? 2 : 0, r->time_us, r->algbw_gbps, r->busbw_gbps);
  if (r->wrong < 0) {
    std::fprintf(out, "  %6s", "N/A");
  } else {
    std::fprintf(out, "  %6lld", static_cast<long long>(r->wrong));
  }
}

}  // namespace

void derive_bandwidth(Record& r) {
  const double seconds = r.time_us * 1e-6;
  r.algbw_gbps = seconds > 0 ? static_cast<double>(r.bytes) / seconds / 1e9 : 0.0;
  r.busbw_gbps = r.algbw_gbps * busbw_factor(r.op, r.ranks);
}

void Report::preamble(const std::string& tool, const std::string& backend, int ranks, const std::string& dtype,
                      const std::string& redop, int iters, int warmup, size_t iter_budget, bool check,
                      const std::optional<MemcpyProbe>& probe) {
  probe_ = probe;
  if (out_ == nullptr) return;
  std::fprintf(out_, "# %s: backend %s, %d ranks, dtype %s, redop %s\n", tool.c_str(), backend.c_str(), ranks,
               dtype.c_str(), redop.c_str());
  std::fprintf(out_,
               "# time: MEDIAN over iterations of the slowest rank's time for one op (us); up to %d iterations "
               "per size (no more than %s of traffic, at least 3) after %d warm-up\n",
               iters, human_size(iter_budget).c_str(), warmup);
  std::fprintf(out_, "# algbw = size / time; busbw = algbw * factor (bench/README.md); 1 GB = 1e9 B\n");
  std::fprintf(out_, "# #wrong: elements differing from the closed-form expectation, all ranks%s\n",
               check ? "" : " (checking disabled: N/A)");
  if (probe) std::fprintf(out_, "# memory-bandwidth probe (the limit on one host): %s\n", describe(*probe).c_str());
  std::fflush(out_);
}

void Report::begin_op(const std::string& op, int index, int total) {
  op_order_.push_back(op);
  if (out_ == nullptr) return;
  std::fprintf(out_, "#\n# [%d/%d] %s\n", index, total, op.c_str());
  // The placement titles, centred over their four columns.
  const auto centred = [](const std::string& s, size_t w) {
    const size_t left = (w - s.size()) / 2;
    return std::string(left, ' ') + s + std::string(w - s.size() - left, ' ');
  };
  std::fprintf(out_, "#%48s%s%s\n", "", centred("out-of-place", 37).c_str(), centred("in-place", 37).c_str());
  std::fprintf(out_, "#%11s  %12s  %6s  %6s  %5s  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s  %5s\n", "size", "count",
               "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
               "iters");
  std::fprintf(out_, "#%11s  %12s  %6s  %6s  %5s  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s  %5s\n", "(B)", "(elements)",
               "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
  std::fflush(out_);
}

void Report::row(const Row& row) {
  const Record& any = row.out_of_place ? *row.out_of_place : *row.in_place;
  if (row.out_of_place) records_.push_back(*row.out_of_place);
  if (row.in_place) records_.push_back(*row.in_place);
  if (out_ == nullptr) return;
  std::fprintf(out_, " %11zu  %12zu  %6s  %6s  %5d", any.bytes, any.count, any.dtype.c_str(), any.redop.c_str(),
               any.root);
  print_cells(out_, row.out_of_place);
  print_cells(out_, row.in_place);
  const int iters = row.out_of_place ? row.out_of_place->iters : row.in_place->iters;
  std::fprintf(out_, "  %5d\n", iters);
  std::fflush(out_);
}

void Report::note(const std::string& line) {
  if (out_ == nullptr) return;
  std::fprintf(out_, "# %s\n", line.c_str());
  std::fflush(out_);
}

int64_t Report::summary() {
  struct Acc {
    double busbw_sum = 0;
    int n = 0;
    int64_t wrong = 0;
    bool checked = false;
    double best = 0;
  };
  std::map<std::string, Acc> per_op;
  Acc all;
  for (const Record& r : records_) {
    for (Acc* a : {&per_op[r.op], &all}) {
      a->busbw_sum += r.busbw_gbps;
      a->n += 1;
      a->best = std::max(a->best, r.busbw_gbps);
      if (r.wrong >= 0) {
        a->wrong += r.wrong;
        a->checked = true;
      }
    }
  }
  if (out_ != nullptr) {
    std::fprintf(out_, "#\n# Summary (averages over every size and both placements, as nccl-tests)\n");
    for (const std::string& op : op_order_) {
      const Acc& a = per_op[op];
      if (a.n == 0) continue;
      std::fprintf(out_, "#   %-15s avg busbw %8.3f GB/s   peak %8.3f GB/s   #wrong %s\n", op.c_str(),
                   a.busbw_sum / a.n, a.best,
                   a.checked ? (a.wrong == 0 ? "0 OK" : (std::to_string(a.wrong) + " FAILED").c_str()) : "N/A");
    }
    std::fprintf(out_, "# Out of bounds values : %s\n",
                 all.checked ? (all.wrong == 0 ? "0 OK" : (std::to_string(all.wrong) + " FAILED").c_str())
                             : "N/A (not checked)");
    std::fprintf(out_, "# Avg bus bandwidth    : %.3f GB/s\n", all.n > 0 ? all.busbw_sum / all.n : 0.0);
    if (probe_ && probe_->gbps > 0) {
      // Only sizes beyond the caches are held against the memory-bound probe.
      double best_large = -1;
      for (const Record& r : records_) {
        if (r.bytes >= probe_->bytes) best_large = std::max(best_large, r.busbw_gbps);
      }
      if (best_large >= 0) {
        std::fprintf(out_, "# Peak busbw at sizes >= %s: %.3f GB/s = %.2f x the memcpy probe (%.2f GB/s)\n",
                     human_size(probe_->bytes).c_str(), best_large, best_large / probe_->gbps, probe_->gbps);
      } else {
        std::fprintf(out_, "# memcpy probe: %.2f GB/s (no size >= %s measured to hold against it)\n", probe_->gbps,
                     human_size(probe_->bytes).c_str());
      }
    }
    std::fflush(out_);
  }
  return all.wrong;
}

bool write_json(const std::string& path, const std::vector<Record>& records, const std::optional<MemcpyProbe>& probe) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Record& r : records) {
    out.push_back({{"backend", r.backend}, {"op", r.op}, {"ranks", r.ranks}, {"bytes", r.bytes}, {"count", r.count},
                   {"dtype", r.dtype}, {"redop", r.redop}, {"root", r.root}, {"in_place", r.in_place},
                   {"iters", r.iters}, {"time_us", json_number(r.time_us)}, {"algbw_gbps", json_number(r.algbw_gbps)},
                   {"busbw_gbps", json_number(r.busbw_gbps)}, {"wrong", static_cast<long long>(r.wrong)}});
  }
  if (probe) {
    out.push_back({{"probe", "memcpy"}, {"bytes", probe->bytes}, {"runs", probe->runs}, {"gbps", json_number(probe->gbps)}});
  }
  const std::string text = out.dump(1) + "\n";
  std::fwrite(text.data(), 1, text.size(), f);
  const bool ok = std::fclose(f) == 0;
  if (!ok) std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
  return ok;
}

}  // namespace torus::bench
