// OptionSet: every accepted form, config-file precedence over argument order,
// all-or-nothing parsing, help text layout, effective values and JSON, and
// each error (unknown option with suggestion, missing value, bad numbers,
// config file mistakes with file:line).
#include "torus/train/options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "torus/core/error.h"

namespace torus::train {
namespace {

struct Config {
  int tp = 1;
  int64_t steps = 200;
  double lr = 3e-4;
  bool compile = false;
  bool verbose = true;
  std::string data = "/usr/share/common-licenses";
  int64_t warmup_steps = 10;
};

void register_all(OptionSet& o, Config& c) {
  o.add("tp", &c.tp, "tensor-parallel size");
  o.add("steps", &c.steps, "optimizer steps");
  o.add("lr", &c.lr, "peak learning rate");
  o.add("compile", &c.compile, "compile the model");
  o.add("verbose", &c.verbose, "log more");
  o.add("data", &c.data, "corpus file or directory", "PATH");
  o.add("warmup-steps", &c.warmup_steps, "linear warm-up steps");
}

// Parses a command line given as words (the program name is prepended).
ParseResult parse(OptionSet& o, std::vector<std::string> words) {
  std::vector<const char*> argv{"torus-train"};
  for (const auto& w : words) argv.push_back(w.c_str());
  return o.parse(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(OptionSet& o, std::vector<std::string> words) {
  try {
    parse(o, std::move(words));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/torus_options_XXXXXX";
    int fd = ::mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Options, EveryFormAssigns) {
  Config c;
  OptionSet o;
  register_all(o, c);
  EXPECT_EQ(parse(o, {"--tp", "4", "--lr=0.001", "--data", "/tmp/x y", "--compile", "--no-verbose", "--steps", "-5",
                      "--warmup_steps=7"}),
            ParseResult::kOk);
  EXPECT_EQ(c.tp, 4);
  EXPECT_DOUBLE_EQ(c.lr, 0.001);
  EXPECT_EQ(c.data, "/tmp/x y");
  EXPECT_TRUE(c.compile);
  EXPECT_FALSE(c.verbose);
  EXPECT_EQ(c.steps, -5);
  EXPECT_EQ(c.warmup_steps, 7);  // registered as warmup-steps, given as warmup_steps
  EXPECT_TRUE(o.is_set("tp"));
  EXPECT_TRUE(o.is_set("warmup_steps"));

  Config d;
  OptionSet p;
  register_all(p, d);
  parse(p, {"--compile=yes", "--verbose=0", "--lr", "+2.5e-4", "--tp=+3", "--warmup-steps", "0"});
  EXPECT_TRUE(d.compile);
  EXPECT_FALSE(d.verbose);
  EXPECT_DOUBLE_EQ(d.lr, 2.5e-4);
  EXPECT_EQ(d.tp, 3);
  EXPECT_EQ(d.warmup_steps, 0);
  EXPECT_FALSE(p.is_set("steps"));
  EXPECT_FALSE(p.is_set("data"));
}

TEST(Options, LaterFlagWinsAndEmptyStringAllowed) {
  Config c;
  OptionSet o;
  register_all(o, c);
  parse(o, {"--tp", "2", "--tp", "8", "--data="});
  EXPECT_EQ(c.tp, 8);
  EXPECT_EQ(c.data, "");
}

TEST(Options, ConfigFileAppliedFirstWhateverTheOrder) {
  TempFile cfg(
      "# a comment\n"
      "\n"
      "tp = 2\n"
      "  lr=0.5   # trailing comment\n"
      "data = \"/path/with # hash\"  # comment after quotes\n"
      "compile = true\n"
      "warmup-steps = '42'\n"
      "steps = 1000\r\n");
  Config c;
  OptionSet o;
  register_all(o, c);
  // --tp comes before --config on the command line and still wins.
  parse(o, {"--tp", "8", "--config", cfg.path(), "--no-compile"});
  EXPECT_EQ(c.tp, 8);
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_EQ(c.data, "/path/with # hash");
  EXPECT_FALSE(c.compile);
  EXPECT_EQ(c.warmup_steps, 42);
  EXPECT_EQ(c.steps, 1000);
  EXPECT_TRUE(o.is_set("lr"));
  EXPECT_FALSE(o.is_set("verbose"));
}

TEST(Options, BadConfigFileAppliesNothing) {
  // Quoted values are kept verbatim: "  42" is not an integer.
  TempFile cfg("tp = 2\nlr = 0.5\n# x\n\nsteps = 5\ndata = x\nwarmup-steps = '  42'\n");
  Config c;
  OptionSet o;
  register_all(o, c);
  std::string err = error_of(o, {"--config=" + cfg.path(), "--tp", "3"});
  EXPECT_TRUE(contains(err, cfg.path() + ":7")) << err;
  EXPECT_TRUE(contains(err, "not an integer")) << err;
  EXPECT_EQ(c.tp, 1);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.data, "/usr/share/common-licenses");
}

TEST(Options, ConfigFileOnItsOwnAndTwoFilesInOrder) {
  TempFile a("tp = 2\nlr = 0.1\n");
  TempFile b("tp = 3\n");
  Config c;
  OptionSet o;
  register_all(o, c);
  parse(o, {"--config", a.path(), "--config", b.path()});
  EXPECT_EQ(c.tp, 3);
  EXPECT_DOUBLE_EQ(c.lr, 0.1);

  Config d;
  OptionSet p;
  register_all(p, d);
  p.apply_config_file(a.path());
  EXPECT_EQ(d.tp, 2);
}

TEST(Options, ConfigFileErrorsNameFileAndLine) {
  Config c;
  OptionSet o;
  register_all(o, c);
  {
    TempFile f("tp = 2\n\n# x\nlearning_rate = 3\n");
    std::string err = error_of(o, {"--config", f.path()});
    EXPECT_TRUE(contains(err, f.path() + ":4")) << err;
    EXPECT_TRUE(contains(err, "unknown option 'learning_rate'")) << err;
  }
  {
    TempFile f("tp 2\n");
    std::string err = error_of(o, {"--config", f.path()});
    EXPECT_TRUE(contains(err, f.path() + ":1")) << err;
    EXPECT_TRUE(contains(err, "expected 'name = value'")) << err;
  }
  {
    TempFile f("data = \"unterminated\n");
    EXPECT_TRUE(contains(error_of(o, {"--config", f.path()}), "unterminated quote"));
  }
  {
    TempFile f("data = \"x\" y\n");
    EXPECT_TRUE(contains(error_of(o, {"--config", f.path()}), "after the closing quote"));
  }
  {
    TempFile f("config = other.cfg\n");
    EXPECT_TRUE(contains(error_of(o, {"--config", f.path()}), "do not nest"));
  }
  {
    TempFile f("lr = fast\n");
    std::string err = error_of(o, {"--config", f.path()});
    EXPECT_TRUE(contains(err, f.path() + ":1: lr")) << err;
    EXPECT_TRUE(contains(err, "'fast' is not a number")) << err;
  }
  std::string err = error_of(o, {"--config", "/nonexistent/run.cfg"});
  EXPECT_TRUE(contains(err, "cannot read config file '/nonexistent/run.cfg'")) << err;
  EXPECT_EQ(c.tp, 1);
}

TEST(Options, CommandLineErrors) {
  Config c;
  OptionSet o;
  register_all(o, c);
  std::string err = error_of(o, {"--lrr", "0.1"});
  EXPECT_TRUE(contains(err, "unknown option 'lrr'")) << err;
  EXPECT_TRUE(contains(err, "did you mean 'lr'")) << err;
  err = error_of(o, {"--warmup", "3"});
  EXPECT_TRUE(contains(err, "did you mean 'warmup-steps'")) << err;
  err = error_of(o, {"--confg", "x"});
  EXPECT_TRUE(contains(err, "did you mean 'config'")) << err;

  EXPECT_TRUE(contains(error_of(o, {"--tp"}), "--tp: missing value"));
  EXPECT_TRUE(contains(error_of(o, {"--tp", "--lr", "1"}), "--tp: missing value"));
  EXPECT_TRUE(contains(error_of(o, {"--config"}), "missing value"));
  EXPECT_TRUE(contains(error_of(o, {"--tp", "abc"}), "--tp: 'abc' is not an integer"));
  EXPECT_TRUE(contains(error_of(o, {"--tp", "1.5"}), "not an integer"));
  EXPECT_TRUE(contains(error_of(o, {"--tp", ""}), "not an integer"));
  EXPECT_TRUE(contains(error_of(o, {"--tp", "3000000000"}), "out of range"));  // > INT_MAX
  EXPECT_TRUE(contains(error_of(o, {"--steps", "99999999999999999999"}), "out of range"));
  EXPECT_TRUE(contains(error_of(o, {"--lr", "1e400"}), "not a finite double"));
  EXPECT_TRUE(contains(error_of(o, {"--lr", "nan"}), "not a finite double"));
  EXPECT_TRUE(contains(error_of(o, {"--lr", "0.1x"}), "is not a number"));
  EXPECT_TRUE(contains(error_of(o, {"--compile=maybe"}), "not a bool"));
  EXPECT_TRUE(contains(error_of(o, {"--no-tp"}), "not a bool option"));
  EXPECT_TRUE(contains(error_of(o, {"--no-compile=1"}), "takes no value"));
  EXPECT_TRUE(contains(error_of(o, {"stray"}), "unexpected argument 'stray'"));
  EXPECT_TRUE(contains(error_of(o, {"-x"}), "unknown option '-x'"));
  // A bool flag does not take the next word as its value.
  EXPECT_TRUE(contains(error_of(o, {"--compile", "true"}), "unexpected argument 'true'"));
  // Nothing was applied by any failed parse.
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.steps, 200);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_FALSE(c.compile);
}

TEST(Options, FailedParseIsAllOrNothing) {
  Config c;
  OptionSet o;
  register_all(o, c);
  EXPECT_THROW(parse(o, {"--tp", "4", "--lr", "oops"}), InvalidArgument);
  EXPECT_EQ(c.tp, 1);
}

TEST(Options, HelpIsReportedAndAppliesNothing) {
  Config c;
  OptionSet o;
  register_all(o, c);
  EXPECT_EQ(parse(o, {"--tp", "4", "--help"}), ParseResult::kHelp);
  EXPECT_EQ(parse(o, {"-h", "--bogus"}), ParseResult::kHelp);
  EXPECT_EQ(c.tp, 1);
}

TEST(Options, HelpTextListsEveryOptionAligned) {
  Config c;
  OptionSet o;
  register_all(o, c);
  std::string help = o.help_text("/usr/bin/torus-train", "Trains a byte-level GPT.");
  EXPECT_EQ(help.rfind("usage: torus-train [options]\n\nTrains a byte-level GPT.\n\noptions:\n", 0), 0u) << help;
  std::istringstream in(help);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  // (left column, help text) expected for every option row.
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"--tp N", "tensor-parallel size (default: 1)"},
      {"--steps N", "optimizer steps (default: 200)"},
      {"--lr X", "peak learning rate (default: 0.0003)"},
      {"--[no-]compile", "compile the model (default: false)"},
      {"--[no-]verbose", "log more (default: true)"},
      {"--data PATH", "corpus file or directory (default: \"/usr/share/common-licenses\")"},
      {"--warmup-steps N", "linear warm-up steps (default: 10)"},
      {"--config FILE", "read 'name = value' lines from FILE first; command-line flags override them"},
      {"-h, --help", "print this help and exit"},
  };
  // The widest left column is "--warmup-steps N" (16): help starts at 2 + 16 + 2.
  const size_t column = 2 + std::string("--warmup-steps N").size() + 2;
  size_t found = 0;
  for (const auto& [left, text] : rows) {
    for (const std::string& l : lines) {
      if (l.rfind("  " + left + " ", 0) != 0) continue;
      ++found;
      EXPECT_EQ(l.find(text), column) << l;
      EXPECT_EQ(l.size(), column + text.size()) << l;
    }
  }
  EXPECT_EQ(found, rows.size()) << help;
  EXPECT_EQ(help.back(), '\n');
}

TEST(Options, ValuesAndJson) {
  Config c;
  OptionSet o;
  register_all(o, c);
  parse(o, {"--tp", "2", "--data", "a \"quoted\" path", "--compile"});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"tp", "2"},
      {"steps", "200"},
      {"lr", "0.0003"},
      {"compile", "true"},
      {"verbose", "true"},
      {"data", "a \"quoted\" path"},
      {"warmup-steps", "10"},
  };
  EXPECT_EQ(o.values(), expected);
  EXPECT_EQ(o.to_json(),
            "{\"tp\": 2, \"steps\": 200, \"lr\": 0.0003, \"compile\": true, \"verbose\": true, "
            "\"data\": \"a \\\"quoted\\\" path\", \"warmup-steps\": 10}");
  EXPECT_EQ(o.names(), (std::vector<std::string>{"tp", "steps", "lr", "compile", "verbose", "data", "warmup-steps"}));
  EXPECT_THROW(o.is_set("nope"), InvalidArgument);
}

TEST(Options, RegistrationErrors) {
  int x = 0;
  bool b = false;
  OptionSet o;
  o.add("tp", &x, "");
  EXPECT_THROW(o.add("tp", &x, ""), InvalidArgument);
  EXPECT_THROW(o.add("help", &b, ""), InvalidArgument);
  EXPECT_THROW(o.add("config", &x, ""), InvalidArgument);
  EXPECT_THROW(o.add("no-cache", &b, ""), InvalidArgument);
  EXPECT_THROW(o.add("Bad", &x, ""), InvalidArgument);
  EXPECT_THROW(o.add("", &x, ""), InvalidArgument);
  EXPECT_THROW(o.add("-x", &x, ""), InvalidArgument);
  EXPECT_THROW(o.add("null", static_cast<int*>(nullptr), ""), InvalidArgument);
  o.add("a_b", &x, "");
  EXPECT_THROW(o.add("a-b", &x, ""), InvalidArgument);  // same option once normalised
}

TEST(Options, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("lr", "lr"), 0u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
}

}  // namespace
}  // namespace torus::train
