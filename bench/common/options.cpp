// bench/common/options.cpp — see options.h.
#include "options.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "sweep.h"

namespace torus::bench {

Args::Args(int argc, char** argv) : args_(argv + 1, argv + argc), used_(args_.size(), false) {}

bool Args::flag(std::initializer_list<std::string_view> names) {
  bool found = false;
  for (size_t i = 0; i < args_.size(); ++i) {
    if (!used_[i] && std::find(names.begin(), names.end(), args_[i]) != names.end()) {
      used_[i] = true;
      found = true;
    }
  }
  return found;
}

std::optional<std::string> Args::value(std::initializer_list<std::string_view> names) {
  std::optional<std::string> result;  // the last occurrence wins
  for (size_t i = 0; i < args_.size(); ++i) {
    if (used_[i]) continue;
    for (std::string_view name : names) {
      const std::string& a = args_[i];
      if (a == name) {
        if (i + 1 >= args_.size()) throw std::invalid_argument("option " + a + " needs a value");
        used_[i] = used_[i + 1] = true;
        result = args_[i + 1];
        break;
      }
      if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        used_[i] = true;
        result = a.substr(name.size() + 1);
        break;
      }
    }
  }
  return result;
}

void Args::finish() const {
  for (size_t i = 0; i < args_.size(); ++i) {
    if (!used_[i]) throw std::invalid_argument("unknown argument '" + args_[i] + "' (see --help)");
  }
}

std::vector<size_t> SweepOptions::sweep() const {
  return sizes.empty() ? size_sweep(min_bytes, max_bytes, factor) : sizes;
}

namespace {

int parse_int(const std::string& text, const char* what, int min) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < min) {
    throw std::invalid_argument(std::string(what) + " must be an integer >= " + std::to_string(min) + ", got '" + text +
                                "'");
  }
  return v;
}

}  // namespace

SweepOptions parse_sweep_options(Args& args, const std::vector<std::string>& default_ops,
                                 const std::vector<std::string>& known_ops) {
  SweepOptions o;
  o.help = args.flag({"-h", "--help"});
  if (auto v = args.value({"-b", "--minbytes"})) o.min_bytes = parse_size(*v);
  if (auto v = args.value({"-e", "--maxbytes"})) o.max_bytes = parse_size(*v);
  if (auto v = args.value({"-f", "--stepfactor"})) o.factor = std::stod(*v);
  if (auto v = args.value({"--sizes"})) {
    for (const std::string& s : split_list(*v)) o.sizes.push_back(parse_size(s));
  }
  o.ops = default_ops;
  if (auto v = args.value({"--ops"})) o.ops = split_list(*v);
  for (const std::string& op : o.ops) {
    if (std::find(known_ops.begin(), known_ops.end(), op) == known_ops.end()) {
      std::string known;
      for (const std::string& k : known_ops) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown op '" + op + "' (known: " + known + ")");
    }
  }
  if (auto v = args.value({"-n", "--iters"})) o.iters = parse_int(*v, "--iters", 1);
  if (auto v = args.value({"-w", "--warmup"})) o.warmup = parse_int(*v, "--warmup", 0);
  if (auto v = args.value({"--settle-ms"})) o.settle_ms = parse_nonnegative(*v, "--settle-ms", " in ms");
  if (auto v = args.value({"--iter-budget"})) o.iter_budget = parse_size(*v);
  if (args.flag({"--check"})) o.check = true;
  if (args.flag({"--no-check"})) o.check = false;
  if (auto v = args.value({"-c"})) o.check = *v != "0";  // nccl-tests spelling: -c 0|1
  if (args.flag({"--no-probe"})) o.probe = false;
  if (auto v = args.value({"--json"})) o.json = *v;
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("--minbytes is larger than --maxbytes");
  (void)o.sweep();  // validates the factor
  return o;
}

std::string sweep_options_help() {
  return R"(Size sweep (nccl-tests style):
  -b, --minbytes SIZE    smallest size (default 8); SIZE: 8, 1K, 64M, 1G (powers of 1024)
  -e, --maxbytes SIZE    largest size (default 256M)
  -f, --stepfactor F     multiply the size by F each step (default 2)
      --sizes LIST       explicit comma-separated sizes instead of -b/-e/-f
      --ops LIST         comma-separated ops (default: all this tool knows)
  -n, --iters N          timed iterations per size and placement (default 20)
  -w, --warmup N         warm-up iterations (default 5)
      --settle-ms MS     before the sweep, 8-byte all-reduces back to back for MS ms, so that
                         the scheduler has spread the ranks over the cores (default 200)
      --iter-budget SIZE cap iterations so that size * iterations <= SIZE (default 1G);
                         never fewer than 3 timed iterations
      --check, --no-check
                         verify every measured size (default: on); -c 0|1 also works
      --no-probe         skip the single-core memcpy probe
      --json FILE        also write the results as JSON records (rank 0)
  -h, --help             this text
)";
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

int64_t parse_int(const std::string& s, const char* what, int64_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < min) {
    throw std::invalid_argument(std::string(what) + " must be an integer >= " + std::to_string(min) + ", got '" + s +
                                "'");
  }
  return v;
}

double parse_nonnegative(const std::string& s, const char* what, const char* unit) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0)) {
    throw std::invalid_argument(std::string(what) + " must be a number >= 0" + unit + ", got '" + s + "'");
  }
  return v;
}

}  // namespace torus::bench
