// The option table of a training run (run_config.h), on CLI11.
#include "torus/run/run_config.h"

#include "torus/device/hardware.h"
#include "torus/run/model_presets.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <deque>
#include <string_view>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <variant>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::run {
namespace {

// The layout's fields, bound to a RunConfig's layout (one LayoutField per
// option).
struct LayoutFields {
  parallel::Layout* layout;
};
struct LayoutOption {
  parallel::Layout* layout;
  const parallel::LayoutField* field;
};
using Dest = std::variant<int*, int64_t*, double*, bool*, std::string*, LayoutOption, LayoutFields>;

struct Entry {
  std::string name;
  Dest dest;
  std::string help;
};

// The rows of `rows` with the LayoutFields row replaced by one row per
// layout field.
std::vector<Entry> expand(std::vector<Entry> rows) {
  std::vector<Entry> out;
  for (Entry& e : rows) {
    if (const auto* lf = std::get_if<LayoutFields>(&e.dest)) {
      for (const parallel::LayoutField& f : parallel::layout_fields()) {
        out.push_back({f.name, LayoutOption{lf->layout, &f}, f.help});
      }
    } else {
      out.push_back(std::move(e));
    }
  }
  return out;
}

// The table: every option once, bound to a RunConfig. CLI options, the
// values() listing and the JSON record all come from here.
std::vector<Entry> table(RunConfig& c) {
  return expand({
      {"model", &c.model, "model preset: " + model_preset_names() + " (docs/models.md), or a Hugging Face model directory whose config.json gives the shape (docs/hf.md)"},
      {"layers", &c.layers, "transformer blocks (0: the preset's)"},
      {"hidden", &c.hidden, "model width (0: the preset's)"},
      {"heads", &c.heads, "attention heads, divisible by --tp (0: the preset's)"},
      {"kv-heads", &c.kv_heads, "Llama: key/value heads, dividing --heads (0: the preset's)"},
      {"ffn", &c.ffn, "MLP width (0: the preset's; GPT 4 x hidden, Llama 8/3 x hidden rounded to 256)"},
      {"vocab", &c.vocab, "vocabulary size (0: the preset's, or the token file's)"},
      {"rope-theta", &c.rope_theta, "Llama: rotary embedding base (0: the preset's)"},
      {"seq", &c.seq, "sequence length in tokens (divisible by --tp with --sp)"},
      {"dropout", &c.dropout, "embedding, residual and attention dropout"},
      {"tie-embeddings", &c.tie_embeddings, "share the input embedding with the output layer"},
      {"moe-every", &c.moe_every, "every K-th block has a mixture-of-experts MLP (blocks K-1, 2K-1, ...; 0: dense)"},
      {"experts", &c.experts, "MoE: experts per MoE layer"},
      {"top-k", &c.top_k, "MoE: experts each token is routed to"},
      {"capacity-factor", &c.capacity_factor, "MoE: expert capacity = factor x k x tokens / experts (0: dropless)"},
      {"aux-loss-weight", &c.aux_loss_weight, "MoE: load-balancing loss weight (-1: 0.01, or 0 with --aux-loss-free)"},
      {"z-loss-weight", &c.z_loss_weight, "MoE: router z-loss weight"},
      {"aux-loss-free", &c.aux_loss_free, "MoE: balance with a per-expert selection bias updated from the load"},
      {"bias-update-rate", &c.bias_update_rate, "MoE: --aux-loss-free bias step per optimizer step"},
      {"moe-jitter", &c.moe_jitter, "MoE: multiplicative router-input noise in training (0: none)"},
      {"moe-ffn", &c.moe_ffn, "MoE: each expert's MLP width (0: --ffn)"},
      {"precision", &c.precision, "parameters and activations: f32, bf16 or fp16 (f64 for tests)"},
      {"autocast", &c.autocast, "LibTorch autocast (bf16) over f32 parameters instead of half parameters"},
      {"grad-dtype", &c.grad_dtype, "gradient accumulation: f32 buffers or the parameter dtype (param)"},
      {"loss-scale", &c.loss_scale, "fp16: 0 = dynamic loss scaling, > 0 = this constant scale"},
      {"initial-loss-scale", &c.initial_loss_scale, "fp16: the dynamic scale at the start"},
      {"loss-scale-window", &c.loss_scale_window, "fp16: clean steps before the scale doubles"},
      {"hysteresis", &c.hysteresis, "fp16: overflows tolerated before the scale halves"},
      {"min-loss-scale", &c.min_loss_scale, "fp16: an overflow at this scale stops the run"},
      {"zero-prefetch", &c.zero_prefetch, "--zero 3: blocks gathered ahead of the one running"},
      {"force", &c.force, "start even when the memory pre-check says the run does not fit"},
      {"plan", &c.plan, "let the planner (torus-plan) choose tp, pp, dp, ep, sp, schedule, ZeRO, offload, recompute and micro-batches for this world; prints its choice first"},
      {"plan-hardware", &c.plan_hardware, "--plan: the hardware to plan for: " + device::hardware_names() + " (cpu: this host, measured)"},
      // The layout's fields (parallel/layout.h) take their place here.
      {"", LayoutFields{&c.layout}, ""},
      {"optimizer", &c.optimizer, "sgd, adam or adamw"},
      {"lr", &c.lr, "peak learning rate"},
      {"min-lr", &c.min_lr, "learning rate at the end of the cosine decay"},
      {"warmup", &c.warmup, "linear warm-up steps (-1: 30, at most steps / 10)"},
      {"weight-decay", &c.weight_decay, "weight decay of matrices and embeddings (decoupled for adamw)"},
      {"beta1", &c.beta1, "adam, adamw: first-moment decay"},
      {"beta2", &c.beta2, "adam, adamw: second-moment decay"},
      {"eps", &c.eps, "adam, adamw: denominator epsilon"},
      {"momentum", &c.momentum, "sgd: momentum (0: none)"},
      {"nesterov", &c.nesterov, "sgd: Nesterov momentum"},
      {"grad-clip", &c.grad_clip, "clip the global gradient norm to this (0: off)"},
      {"steps", &c.steps, "optimizer steps"},
      {"batch", &c.batch, "global batch in sequences (divisible by dp x micro-batches)"},
      {"seed", &c.seed, "seed of the initialisation, dropout and the data order"},
      {"data", &c.data, "a text file or a directory of them (bytes as tokens; default: the licence texts every Debian system ships), or a tokenized dataset: a .tok file or a Megatron .bin/.idx prefix (docs/data.md)"},
      {"val-fraction", &c.val_fraction, "share of the corpus held out for validation (its end)"},
      {"eval-interval", &c.eval_interval, "steps between validation passes (0: only at the end)"},
      {"eval-batches", &c.eval_batches, "batches per validation pass"},
      {"out", &c.out, "output directory: metrics.jsonl, tb/ (TensorBoard)"},
      {"log-interval", &c.log_interval, "steps between log lines"},
      {"progress", &c.progress, "progress bar on stderr: auto (if a terminal), on, off"},
      {"tensorboard", &c.tensorboard, "write TensorBoard event files under <out>/tb"},
      {"peak-tflops", &c.peak_tflops, "the job's peak TFLOP/s for MFU (0: the device's; on CPU measured once per host)"},
      {"threads", &c.threads, "intra-op threads per rank (0: cores / local ranks, at least 1)"},
      {"save-dir", &c.save_dir, "checkpoint directory (empty: <out>/checkpoints)"},
      {"save-every", &c.save_every, "save a checkpoint every N steps and at the end (0: no periodic saves)"},
      {"save-final", &c.save_final, "save a checkpoint at the end of the run"},
      {"keep-last", &c.keep_last, "keep the newest K complete checkpoints, delete older ones (0: keep all)"},
      {"async-save", &c.async_save, "checkpoint from a host snapshot in a background thread"},
      {"resume", &c.resume, "resume from: auto (the newest good checkpoint in --save-dir) or a checkpoint path"},
      {"init-from", &c.init_from, "initial model weights: a safetensors file of global parameter names, or a Hugging Face model directory (config.json + model.safetensors or its index; GPT-2 and Llama, docs/hf.md)"},
      {"save-timeout", &c.save_timeout, "seconds rank 0 waits for the other ranks' checkpoint files"},
      {"fail-rank", &c.fail_rank, "testing: this rank kills itself (SIGKILL) ..."},
      {"fail-step", &c.fail_step, "testing: ... at the start of this step"},
  });
}

std::string normalise(std::string s) {
  for (char& ch : s) {
    if (ch == '_') ch = '-';
  }
  return s;
}

std::string number_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string value_text(const Dest& d) {
  if (const auto* o = std::get_if<LayoutOption>(&d)) return o->field->get(*o->layout);
  if (std::holds_alternative<LayoutFields>(d)) return "";
  return std::visit(
      [](auto p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, LayoutOption> || std::is_same_v<T, LayoutFields>) {
          return "";
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, double>) {
          return number_text(*p);
        } else {
          return std::to_string(*p);
        }
      },
      d);
}

// Config items named with underscores match the dashed option names.
class Config : public CLI::ConfigTOML {
 public:
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    auto items = CLI::ConfigTOML::from_config(input);
    for (auto& item : items) item.name = normalise(item.name);
    return items;
  }
};

// Help lines show bools as `--[no-]sp` instead of CLI11's
// `--sp,--no-sp{false}`.
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, positional);
    const size_t comma = name.find(",--no-");
    if (comma != std::string::npos) name = "--[no-]" + name.substr(2, comma - 2);
    return name;
  }
};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

struct Parser {
  RunConfig scratch;
  CLI::App app;
  std::vector<Entry> entries;
  // The layout's options parse into text (or a bool) first; commit() sets
  // the fields through the table, which checks the form of each value.
  struct Pending {
    LayoutOption option;
    std::string text;
    bool flag = false;
  };
  std::deque<Pending> pending;

  explicit Parser(const RunConfig& defaults, const std::string& program, const std::string& description)
      : scratch(defaults), app(description, program) {
    entries = table(scratch);
    app.config_formatter(std::make_shared<Config>());
    app.set_config("--config", "", "read `name = value` lines from FILE (flags on the command line override it)");
    app.get_config_ptr()->type_name("FILE");
    app.allow_config_extras(CLI::config_extras_mode::error);
    app.formatter(std::make_shared<Formatter>());
    app.get_formatter()->column_width(34);
    // A repeated option takes its last value, as argparse and torchrun do:
    // a script may append an override to a base command line.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    for (auto& e : entries) {
      const std::string flag = "--" + e.name;
      if (const auto* o = std::get_if<LayoutOption>(&e.dest)) {
        Pending& p = pending.emplace_back(Pending{*o, o->field->get(*o->layout), false});
        if (o->field->kind == parallel::LayoutField::Kind::kBool) {
          p.flag = p.text == "true";
          app.add_flag(flag + ",!--no-" + e.name, p.flag, e.help)->default_str(p.text);
        } else {
          app.add_option(flag, p.text, e.help)
              ->default_str(p.text)
              ->type_name(o->field->kind == parallel::LayoutField::Kind::kInt ? "N" : "TEXT");
        }
        continue;
      }
      std::visit(
          [&](auto p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, LayoutOption> || std::is_same_v<T, LayoutFields>) {
              // handled above (LayoutFields rows are expanded by table())
            } else if constexpr (std::is_same_v<T, bool>) {
              app.add_flag(flag + ",!--no-" + e.name, *p, e.help)->default_str(*p ? "true" : "false");
            } else {
              CLI::Option* o = app.add_option(flag, *p, e.help)->capture_default_str();
              if constexpr (std::is_same_v<T, std::string>) {
                o->type_name("TEXT");
              } else if constexpr (std::is_same_v<T, double>) {
                o->type_name("X");
              } else {
                o->type_name("N");
              }
            }
          },
          e.dest);
    }
  }

  // The layout's values into scratch.layout (InvalidArgument naming the
  // option for a malformed one).
  void commit() {
    for (Pending& p : pending) {
      const bool is_bool = p.option.field->kind == parallel::LayoutField::Kind::kBool;
      p.option.field->set(*p.option.layout, is_bool ? (p.flag ? "true" : "false") : p.text);
    }
  }
};

// `--min_lr=1` -> `--min-lr=1`; `--no_sp` -> `--no-sp`.
std::string normalise_arg(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  const size_t eq = arg.find('=');
  if (eq == std::string::npos) return normalise(arg);
  return normalise(arg.substr(0, eq)) + arg.substr(eq);
}

void check(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}

}  // namespace

ParseOutcome parse_run_config(const std::vector<std::string>& args, RunConfig& out) {
  Parser p(out, "torus-train", "");
  // CLI11 parses a reversed vector (the last element is argv[1]).
  std::vector<std::string> rev;
  for (auto it = args.rbegin(); it != args.rend(); ++it) rev.push_back(normalise_arg(*it));
  try {
    p.app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    return ParseOutcome::kHelp;
  } catch (const CLI::CallForAllHelp&) {
    return ParseOutcome::kHelp;
  } catch (const CLI::ExtrasError&) {
    // Name the first unexpected argument, and the closest option to it.
    std::string first;
    for (const std::string& a : p.app.remaining()) {
      first = a;
      break;
    }
    if (first.rfind("--", 0) != 0) throw InvalidArgument(fmt::format("unexpected argument '{}'", first));
    const std::string name = first.substr(2, first.find('=') - 2);
    std::string best;
    size_t best_d = 3;
    for (const auto& e : p.entries) {
      const size_t d = e.name.rfind(name, 0) == 0 ? 1 : edit_distance(name, e.name);
      if (d < best_d) best_d = d, best = e.name;
    }
    throw InvalidArgument(best.empty() ? fmt::format("unknown option '--{}'", name)
                                       : fmt::format("unknown option '--{}' (did you mean '--{}'?)", name, best));
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(e.what());
  }
  p.commit();
  out = p.scratch;
  return ParseOutcome::kOk;
}

ParseOutcome parse_run_config(int argc, const char* const* argv, RunConfig& out) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_run_config(args, out);
}

std::string run_config_help(const std::string& program, const std::string& description) {
  Parser p(RunConfig{}, program, description);
  return p.app.help();
}

std::vector<std::string> run_option_names() {
  RunConfig c;
  std::vector<std::string> names;
  for (const auto& e : table(c)) names.push_back(e.name);
  return names;
}

std::vector<std::pair<std::string, std::string>> RunConfig::values() const {
  RunConfig copy = *this;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : table(copy)) out.emplace_back(e.name, value_text(e.dest));
  return out;
}

std::string RunConfig::to_json() const {
  RunConfig copy = *this;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  const nlohmann::ordered_json layout = nlohmann::ordered_json::parse(copy.layout.to_json());
  for (const auto& e : table(copy)) {
    std::visit(
        [&](auto p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, LayoutOption>) {
            j[e.name] = layout.at(p.field->json_key());
          } else if constexpr (!std::is_same_v<T, LayoutFields>) {
            j[e.name] = *p;
          }
        },
        e.dest);
  }
  return j.dump();
}

int64_t RunConfig::warmup_steps() const { return warmup >= 0 ? warmup : std::min<int64_t>(30, steps / 10); }

void RunConfig::validate() const {
  auto one_of = [](const std::string& v, std::initializer_list<const char*> set, const char* name) {
    std::string names;
    for (const char* s : set) {
      if (v == s) return;
      names += names.empty() ? s : std::string(", ") + s;
    }
    throw InvalidArgument(fmt::format("--{} must be one of {}, got '{}'", name, names, v));
  };
  one_of(precision, {"f32", "bf16", "fp16", "f64"}, "precision");
  one_of(grad_dtype, {"f32", "param"}, "grad-dtype");
  one_of(optimizer, {"sgd", "adam", "adamw"}, "optimizer");
  one_of(progress, {"auto", "on", "off"}, "progress");
  check(!(autocast && precision != "f32"), "--autocast runs over f32 parameters: use it with --precision f32");
  check(find_model_preset(model) != nullptr || is_hf_model_dir(model),
        fmt::format("--model: unknown model '{}' (known: {}; or a Hugging Face model directory with a config.json)",
                    model, model_preset_names()));
  check(layers >= 0 && hidden >= 0 && heads >= 0 && kv_heads >= 0 && ffn >= 0 && vocab >= 0 && rope_theta >= 0,
        "--layers, --hidden, --heads, --kv-heads, --ffn, --vocab and --rope-theta must be >= 0 (0: the preset's)");
  check(seq >= 1, "--seq must be >= 1");
  check(dropout >= 0 && dropout < 1, fmt::format("--dropout must be in [0, 1), got {}", dropout));
  layout.check();
  check(moe_every >= 0, "--moe-every must be >= 0 (0: a dense model)");
  check(layout.ep == 1 || moe_every > 0, "--ep > 1 needs MoE blocks (--moe-every > 0)");
  if (moe_every > 0) {
    check(experts >= 1 && top_k >= 1 && top_k <= experts, "--top-k must be between 1 and --experts");
    check(experts % layout.ep == 0, "--experts must be divisible by --ep");
    check(capacity_factor >= 0, "--capacity-factor must be >= 0 (0: dropless)");
    check(aux_loss_weight >= 0 || aux_loss_weight == -1, "--aux-loss-weight must be >= 0 (or -1: the default)");
    check(z_loss_weight >= 0 && bias_update_rate >= 0, "--z-loss-weight and --bias-update-rate must be >= 0");
    check(moe_jitter >= 0 && moe_jitter < 1, "--moe-jitter must be in [0, 1)");
    check(moe_ffn >= 0, "--moe-ffn must be >= 0 (0: --ffn)");
  }
  check(!layout.expert_tp || moe_every > 0, "--expert-tp needs MoE blocks (--moe-every > 0)");
  check(steps >= 1 && batch >= 1 && log_interval >= 1 && eval_batches >= 1 && eval_interval >= 0,
        "--steps, --batch, --log-interval and --eval-batches must be >= 1 and --eval-interval >= 0");
  check(val_fraction > 0 && val_fraction < 1, fmt::format("--val-fraction must be in (0, 1), got {}", val_fraction));
  check(warmup >= -1 && warmup <= steps, fmt::format("--warmup must be in [-1, --steps = {}], got {}", steps, warmup));
  check(lr >= 0 && min_lr >= 0 && min_lr <= lr, fmt::format("need 0 <= --min-lr ({}) <= --lr ({})", min_lr, lr));
  check(weight_decay >= 0 && grad_clip >= 0 && eps > 0, "--weight-decay and --grad-clip must be >= 0, --eps > 0");
  check(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "--beta1 and --beta2 must be in [0, 1)");
  check(momentum >= 0 && !(nesterov && momentum <= 0), "--momentum must be >= 0, and > 0 with --nesterov");
  check(loss_scale >= 0 && initial_loss_scale > 0 && loss_scale_window >= 1 && hysteresis >= 1 && min_loss_scale > 0 &&
            min_loss_scale <= initial_loss_scale,
        "loss scaling: need --loss-scale >= 0, --initial-loss-scale >= --min-loss-scale > 0, --loss-scale-window >= 1, "
        "--hysteresis >= 1");
  check(peak_tflops >= 0 && threads >= 0, "--peak-tflops and --threads must be >= 0");
  check(save_every >= 0 && keep_last >= 0 && save_timeout > 0,
        "--save-every and --keep-last must be >= 0, --save-timeout > 0");
  check(resume.empty() || init_from.empty(), "--resume and --init-from exclude each other: a resumed run has its weights");
  check(device::find_hardware(plan_hardware) != nullptr,
        fmt::format("--plan-hardware: unknown hardware '{}' (known: {})", plan_hardware, device::hardware_names()));
  check(zero_prefetch >= 0, fmt::format("--zero-prefetch must be >= 0, got {}", zero_prefetch));
}

}  // namespace torus::run
