// torus/train/options.h — a small declarative command-line option parser for
// Torus executables (torus-train and friends). LibTorch-free.
//
// The program registers each option once, with a pointer to the variable that
// receives its value; whatever the variable holds at registration is the
// default shown by help_text():
//
//   int tp = 1; double lr = 3e-4; std::string data = default_corpus_path();
//   torus::train::OptionSet opts;
//   opts.add("tp", &tp, "tensor-parallel size", "N");
//   opts.add("lr", &lr, "peak learning rate", "X");
//   opts.add("data", &data, "corpus file or directory", "PATH");
//   if (opts.parse(argc, argv) == torus::train::ParseResult::kHelp) {
//     std::fputs(opts.help_text(argv[0], "Trains a byte-level GPT.").c_str(), stdout);
//     return 0;
//   }
//
// Accepted forms (Note [Option precedence] gives the order of application):
//   --name value   --name=value          any non-bool option
//   --flag  --no-flag  --flag=BOOL       bool options (BOOL: true/false, 1/0, yes/no, on/off)
//   --config FILE  --config=FILE         read `name = value` lines from FILE
//   -h  --help                           parse() returns ParseResult::kHelp
// A dash and an underscore are the same character in option names, so
// `--warmup-steps` and `--warmup_steps` name one option.
//
// Config file format: one `name = value` per line; blank lines and lines whose
// first non-blank character is `#` are ignored; an unquoted value ends at ` #`
// (a trailing comment); a value may be enclosed in double or single quotes
// (kept verbatim inside, so it may hold `#` or leading blanks). Names are the
// option names without dashes. Bool values are written out: `compile = true`.
//
// Note [Option precedence]: config files are applied first, in the order they
// appear on the command line, then every other command-line flag, left to
// right, wherever it sits relative to --config. A later assignment of the same
// option wins. So the command line always overrides the file.
//
// Errors: every mistake (unknown option, with the closest known name
// suggested — by edit distance, a name that begins with the unknown one
// counting as distance 1; missing value; a number that does not parse or is out of range;
// an unknown key or malformed line in a config file, with file and line; an
// unexpected positional argument) throws torus::InvalidArgument. parse() is
// all-or-nothing: it converts every value before writing any destination, so
// a failed parse leaves every destination as it was.
//
// Thread safety: none; an OptionSet is built and parsed on one thread. The
// destinations must outlive the OptionSet.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace torus::train {

// What parse() found: kOk (destinations updated) or kHelp (-h/--help was
// given; nothing was applied; the program prints help_text() and exits 0).
enum class ParseResult { kOk, kHelp };

class OptionSet {
 public:
  OptionSet() = default;

  // Registers an option. `name` is lower case letters, digits, '-' or '_' and
  // must not be `help`, `config`, or begin with `no-`/`no_`; `placeholder` is
  // the value's name in help_text() (e.g. "N", "PATH"; ignored for bools).
  // The current value of `*dest` is the default. Throws InvalidArgument on a
  // bad or duplicate name or a null `dest`.
  void add(std::string name, int* dest, std::string help, std::string placeholder = "N");
  void add(std::string name, int64_t* dest, std::string help, std::string placeholder = "N");
  void add(std::string name, double* dest, std::string help, std::string placeholder = "X");
  void add(std::string name, bool* dest, std::string help);
  void add(std::string name, std::string* dest, std::string help, std::string placeholder = "STR");

  // Parses argv[1..argc) (argv[0] is the program). Reads the config files
  // named by --config. See the header comment for forms, precedence and
  // errors. Throws InvalidArgument; reading a config file that cannot be
  // opened also throws InvalidArgument naming the path.
  ParseResult parse(int argc, const char* const* argv);

  // Applies one config file on its own (same format and errors as --config),
  // as if it were given on the command line with no other flags.
  void apply_config_file(const std::string& path);

  // Usage text: a `usage:` line, the summary, then one aligned line per option
  // with its placeholder, help and default, then --config and --help. Ends in
  // a newline.
  std::string help_text(std::string_view program, std::string_view summary) const;

  // Current values of every registered option, in registration order, as
  // (name, text): numbers in shortest round-trip form, bools as true/false,
  // strings verbatim. For logging the effective configuration.
  std::vector<std::pair<std::string, std::string>> values() const;

  // The same as one JSON object with typed values (numbers, bools, strings).
  std::string to_json() const;

  // True if the last successful parse() (or apply_config_file) assigned the
  // option from the command line or a config file. Throws InvalidArgument for
  // an unknown name.
  bool is_set(std::string_view name) const;

  // Registered names, in registration order.
  std::vector<std::string> names() const;

 private:
  using Dest = std::variant<int*, int64_t*, double*, bool*, std::string*>;
  struct Option {
    std::string name;  // as registered (help text, values(), to_json())
    std::string key;   // normalised for lookup: '-' written as '_'
    Dest dest;
    std::string help;
    std::string placeholder;
    std::string default_text;
    bool set = false;
  };
  // One pending assignment, before conversion.
  struct Assignment {
    size_t option;
    std::string value;
    std::string where;  // "--lr" or "file.cfg:12", for messages
  };

  void add_option(std::string name, Dest dest, std::string help, std::string placeholder);
  size_t find_or_throw(std::string_view raw_name, std::string_view where) const;
  void read_config(const std::string& path, std::vector<Assignment>* out) const;
  void apply(const std::vector<Assignment>& assignments);

  std::vector<Option> options_;
};

// Edit (Levenshtein) distance between two strings; exposed for tests.
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace torus::train
