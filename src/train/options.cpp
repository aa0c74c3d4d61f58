// OptionSet: registration, command-line and config-file parsing, help text.
#include "torus/train/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>

#include "core/log.h"
#include "torus/core/error.h"
#include "torus/train/metrics.h"

namespace torus::train {
namespace {

std::string normalise(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

std::string_view trim(std::string_view s) {
  size_t b = 0;
  while (b < s.size() && (s[b] == ' ' || s[b] == '\t')) ++b;
  size_t e = s.size();
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) --e;
  return s.substr(b, e - b);
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// Numbers: an optional '+' is accepted; the whole text must be consumed.
std::string_view strip_plus(std::string_view s) {
  return (s.size() > 1 && s[0] == '+' && s[1] != '-') ? s.substr(1) : s;
}

int64_t to_int(std::string_view text, int64_t lo, int64_t hi, std::string_view where) {
  std::string_view s = strip_plus(text);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TORUS_CHECK(!s.empty() && ec != std::errc::invalid_argument && ptr == s.data() + s.size(), InvalidArgument,
              "{}: '{}' is not an integer", where, text);
  TORUS_CHECK(ec != std::errc::result_out_of_range && v >= lo && v <= hi, InvalidArgument,
              "{}: {} is out of range [{}, {}]", where, text, lo, hi);
  return v;
}

double to_double(std::string_view text, std::string_view where) {
  std::string_view s = strip_plus(text);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TORUS_CHECK(!s.empty() && ec != std::errc::invalid_argument && ptr == s.data() + s.size(), InvalidArgument,
              "{}: '{}' is not a number", where, text);
  TORUS_CHECK(ec != std::errc::result_out_of_range && std::isfinite(v), InvalidArgument,
              "{}: '{}' is not a finite double", where, text);
  return v;
}

bool to_bool(std::string_view text, std::string_view where) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  throw InvalidArgument(fmt::format("{}: '{}' is not a bool (true/false, 1/0, yes/no, on/off)", where, text));
}

std::string format_double(double v) {
  return fmt::format("{}", v);
}

// The current value of an option's destination as text; strings JSON-quoted
// or raw.
template <typename DestVariant>
std::string value_text(const DestVariant& dest, bool quote_strings) {
  return std::visit(
      [quote_strings](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>)
          return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>)
          return format_double(*p);
        else if constexpr (std::is_same_v<T, std::string>)
          return quote_strings ? json_quote(*p) : *p;
        else
          return fmt::format("{}", *p);
      },
      dest);
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

void OptionSet::add(std::string name, int* dest, std::string help, std::string placeholder) {
  add_option(std::move(name), dest, std::move(help), std::move(placeholder));
}
void OptionSet::add(std::string name, int64_t* dest, std::string help, std::string placeholder) {
  add_option(std::move(name), dest, std::move(help), std::move(placeholder));
}
void OptionSet::add(std::string name, double* dest, std::string help, std::string placeholder) {
  add_option(std::move(name), dest, std::move(help), std::move(placeholder));
}
void OptionSet::add(std::string name, bool* dest, std::string help) {
  add_option(std::move(name), dest, std::move(help), "");
}
void OptionSet::add(std::string name, std::string* dest, std::string help, std::string placeholder) {
  add_option(std::move(name), dest, std::move(help), std::move(placeholder));
}

void OptionSet::add_option(std::string name, Dest dest, std::string help, std::string placeholder) {
  TORUS_CHECK(!name.empty() &&
                  std::all_of(name.begin(), name.end(),
                              [](char c) {
                                return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
                              }) &&
                  name.front() != '-' && name.front() != '_',
              InvalidArgument, "option name '{}' must be lower-case letters, digits, '-' or '_'", name);
  std::string key = normalise(name);
  TORUS_CHECK(key != "help" && key != "config" && !starts_with(key, "no_"), InvalidArgument,
              "option name '{}' is reserved (help, config, no-*)", name);
  TORUS_CHECK(std::visit([](auto* p) { return p != nullptr; }, dest), InvalidArgument,
              "option '{}' has a null destination", name);
  for (const Option& o : options_) {
    TORUS_CHECK(o.key != key, InvalidArgument, "option '{}' registered twice (as '{}' and '{}')", key, o.name, name);
  }
  Option o;
  o.name = std::move(name);
  o.key = std::move(key);
  o.dest = dest;
  o.help = std::move(help);
  o.placeholder = std::move(placeholder);
  o.default_text = value_text(dest, /*quote_strings=*/true);
  options_.push_back(std::move(o));
}

size_t OptionSet::find_or_throw(std::string_view raw_name, std::string_view where) const {
  std::string key = normalise(raw_name);
  for (size_t i = 0; i < options_.size(); ++i) {
    if (options_[i].key == key) return i;
  }
  // The closest known name (ties: the first registered).
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  // A name the unknown one begins (--warmup for --warmup-steps) counts as distance 1.
  auto distance = [&](std::string_view known) {
    size_t d = edit_distance(key, known);
    return (!key.empty() && starts_with(known, key)) ? std::min<size_t>(d, 1) : d;
  };
  for (const Option& o : options_) {
    size_t d = distance(o.key);
    if (d < best_d) best_d = d, best = o.name;
  }
  for (const char* builtin : {"config", "help"}) {
    size_t d = distance(builtin);
    if (d < best_d) best_d = d, best = builtin;
  }
  throw InvalidArgument(fmt::format("{}: unknown option '{}' (did you mean '{}'?)", where, raw_name, best));
}

void OptionSet::read_config(const std::string& path, std::vector<Assignment>* out) const {
  std::ifstream in(path);
  TORUS_CHECK(in.good(), InvalidArgument, "cannot read config file '{}'", path);
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    std::string where = fmt::format("{}:{}", path, line_no);
    std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    size_t eq = line.find('=');
    TORUS_CHECK(eq != std::string_view::npos, InvalidArgument, "{}: expected 'name = value', got '{}'", where, line);
    std::string_view name = trim(line.substr(0, eq));
    TORUS_CHECK(!name.empty(), InvalidArgument, "{}: missing option name before '='", where);
    TORUS_CHECK(normalise(name) != "config", InvalidArgument, "{}: config files do not nest ('config' key)", where);
    std::string_view rest = trim(line.substr(eq + 1));
    std::string value;
    if (!rest.empty() && (rest.front() == '"' || rest.front() == '\'')) {
      size_t close = rest.find(rest.front(), 1);
      TORUS_CHECK(close != std::string_view::npos, InvalidArgument, "{}: unterminated quote in '{}'", where, line);
      value = std::string(rest.substr(1, close - 1));
      std::string_view after = trim(rest.substr(close + 1));
      TORUS_CHECK(after.empty() || after.front() == '#', InvalidArgument, "{}: text after the closing quote: '{}'",
                  where, after);
    } else if (!rest.empty() && rest.front() == '#') {
      value.clear();
    } else {
      size_t cut = rest.npos;
      for (size_t i = 1; i < rest.size(); ++i) {
        if (rest[i] == '#' && (rest[i - 1] == ' ' || rest[i - 1] == '\t')) {
          cut = i;
          break;
        }
      }
      value = std::string(trim(rest.substr(0, cut)));
    }
    size_t idx = find_or_throw(name, where);
    out->push_back({idx, std::move(value), where + ": " + std::string(name)});
  }
  TORUS_CHECK(!in.bad(), InvalidArgument, "error reading config file '{}'", path);
}

void OptionSet::apply(const std::vector<Assignment>& assignments) {
  using Value = std::variant<int, int64_t, double, bool, std::string>;
  // Convert everything first, so that a bad value leaves all destinations intact.
  std::vector<Value> converted;
  converted.reserve(assignments.size());
  for (const Assignment& a : assignments) {
    const Option& o = options_[a.option];
    converted.push_back(std::visit(
        [&](auto* p) -> Value {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, int>) {
            return static_cast<int>(
                to_int(a.value, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), a.where));
          } else if constexpr (std::is_same_v<T, int64_t>) {
            return to_int(a.value, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), a.where);
          } else if constexpr (std::is_same_v<T, double>) {
            return to_double(a.value, a.where);
          } else if constexpr (std::is_same_v<T, bool>) {
            return to_bool(a.value, a.where);
          } else {
            return a.value;
          }
        },
        o.dest));
  }
  for (Option& o : options_) o.set = false;
  for (size_t i = 0; i < assignments.size(); ++i) {
    Option& o = options_[assignments[i].option];
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          *p = std::get<T>(converted[i]);
        },
        o.dest);
    o.set = true;
  }
}

ParseResult OptionSet::parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i] ? argv[i] : "";
    if (a == "-h" || a == "--help") return ParseResult::kHelp;
  }
  std::vector<std::string> config_files;
  std::vector<Assignment> cli;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i] ? argv[i] : "";
    if (!starts_with(a, "--") || a.size() == 2) {
      TORUS_CHECK(!starts_with(a, "-"), InvalidArgument, "unknown option '{}' (options are written --name)", a);
      throw InvalidArgument(fmt::format("unexpected argument '{}' (options are written --name value)", a));
    }
    std::string_view body = a.substr(2);
    size_t eq = body.find('=');
    std::string_view name = body.substr(0, eq);
    bool has_inline = eq != std::string_view::npos;
    std::string flag = "--" + std::string(name);
    // The value of a non-bool option: inline, or the next argument unless that
    // is itself an option (a value starting with "--" needs --name=value).
    auto take_value = [&]() -> std::string {
      if (has_inline) return std::string(body.substr(eq + 1));
      TORUS_CHECK(i + 1 < argc && argv[i + 1] != nullptr && !starts_with(argv[i + 1], "--"), InvalidArgument,
                  "{}: missing value", flag);
      return argv[++i];
    };
    std::string key = normalise(name);
    if (key == "config") {
      config_files.push_back(take_value());
      continue;
    }
    size_t idx = options_.size();
    for (size_t k = 0; k < options_.size(); ++k) {
      if (options_[k].key == key) idx = k;
    }
    if (idx < options_.size()) {
      if (std::holds_alternative<bool*>(options_[idx].dest)) {
        cli.push_back({idx, has_inline ? std::string(body.substr(eq + 1)) : "true", flag});
      } else {
        cli.push_back({idx, take_value(), flag});
      }
      continue;
    }
    if (starts_with(key, "no_")) {
      std::string base = key.substr(3);
      for (size_t k = 0; k < options_.size(); ++k) {
        if (options_[k].key != base) continue;
        TORUS_CHECK(std::holds_alternative<bool*>(options_[k].dest), InvalidArgument,
                    "{}: '--{}' is not a bool option, so it has no --no- form", flag, options_[k].name);
        TORUS_CHECK(!has_inline, InvalidArgument, "{}: takes no value", flag);
        idx = k;
      }
      if (idx < options_.size()) {
        cli.push_back({idx, "false", flag});
        continue;
      }
    }
    find_or_throw(name, "command line");  // throws, suggesting the closest name
  }
  std::vector<Assignment> all;
  for (const std::string& path : config_files) read_config(path, &all);
  all.insert(all.end(), cli.begin(), cli.end());
  apply(all);
  return ParseResult::kOk;
}

void OptionSet::apply_config_file(const std::string& path) {
  std::vector<Assignment> all;
  read_config(path, &all);
  apply(all);
}

std::string OptionSet::help_text(std::string_view program, std::string_view summary) const {
  size_t slash = program.rfind('/');
  if (slash != std::string_view::npos) program = program.substr(slash + 1);
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Option& o : options_) {
    bool is_bool = std::holds_alternative<bool*>(o.dest);
    std::string left = is_bool ? "--[no-]" + o.name : "--" + o.name + " " + o.placeholder;
    std::string right = o.help;
    right += (right.empty() ? "" : " ") + ("(default: " + o.default_text + ")");
    rows.emplace_back(std::move(left), std::move(right));
  }
  rows.emplace_back("--config FILE", "read 'name = value' lines from FILE first; command-line flags override them");
  rows.emplace_back("-h, --help", "print this help and exit");
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  std::string out = fmt::format("usage: {} [options]\n", program);
  if (!summary.empty()) out += fmt::format("\n{}\n", summary);
  out += "\noptions:\n";
  for (const auto& [left, right] : rows) out += fmt::format("  {:<{}}  {}\n", left, width, right);
  return out;
}

std::vector<std::pair<std::string, std::string>> OptionSet::values() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Option& o : options_) {
    out.emplace_back(o.name, value_text(o.dest, /*quote_strings=*/false));
  }
  return out;
}

std::string OptionSet::to_json() const {
  std::vector<std::pair<std::string, JsonValue>> fields;
  for (const Option& o : options_) {
    fields.emplace_back(o.name, std::visit([](auto* p) { return JsonValue(*p); }, o.dest));
  }
  return json_object(fields);
}

bool OptionSet::is_set(std::string_view name) const {
  std::string key = normalise(name);
  for (const Option& o : options_) {
    if (o.key == key) return o.set;
  }
  throw InvalidArgument(fmt::format("is_set: unknown option '{}'", name));
}

std::vector<std::string> OptionSet::names() const {
  std::vector<std::string> out;
  for (const Option& o : options_) out.push_back(o.name);
  return out;
}

}  // namespace torus::train
