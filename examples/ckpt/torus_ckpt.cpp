// torus-ckpt — looks after Torus checkpoints (docs/checkpoint.md):
//
//   torus-ckpt list DIR                 every checkpoint in a save directory: step, state, size, layout
//   torus-ckpt info PATH                one checkpoint: run, layout, model, data, tensors
//   torus-ckpt verify PATH...           every file's SHA-256 and header; exit 1 naming the first bad file
//   torus-ckpt export PATH OUT.safetensors [--prefix model.] [--all]
//                                       one consolidated safetensors file of full, unpadded tensors
//   torus-ckpt export-hf PATH OUT_DIR [--dtype f32|bf16|f16] [--max-shard-size 5GB] [--tokenizer DIR|-]
//                                       a Hugging Face directory (config.json, model.safetensors or
//                                       shards with their index, the tokenizer's files) of a GPT or
//                                       Llama checkpoint, for from_pretrained (docs/hf.md)
//
// Nothing here executes anything read from disk: the manifest is JSON, the
// tensors safetensors with validated headers.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "torus/checkpoint/checkpoint.h"
#include "torus/engine/hf.h"
#include "torus/run/metrics.h"

namespace {

using namespace torus;
using Json = nlohmann::json;

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string layout_text(const std::string& layout_json) {
  const Json l = Json::parse(layout_json);
  return fmt::format("tp={} pp={} dp={} zero={} {}", l.value("tp", 0), l.value("pp", 0), l.value("dp", 0),
                     l.value("zero", 0), l.value("precision", "?"));
}

int cmd_list(const std::string& dir) {
  const auto all = ckpt::list_checkpoints(dir);
  if (all.empty()) {
    fmt::print("{}: no checkpoints\n", dir);
    return 0;
  }
  fmt::print("{:>10}  {:<10}  {:>10}  {:<32}  {}\n", "step", "state", "size", "layout", "path");
  for (const auto& l : all) {
    if (l.complete) {
      const auto ck = ckpt::Checkpoint::open(l.path);
      fmt::print("{:>10}  {:<10}  {:>10}  {:<32}  {}\n", l.step, "complete", human(static_cast<double>(ck.total_bytes())),
                 layout_text(ck.info().layout), l.path);
    } else {
      fmt::print("{:>10}  {:<10}  {:>10}  {:<32}  {}\n           {}\n", l.step, "unusable", "-", "-", l.path, l.problem);
    }
  }
  return 0;
}

int cmd_info(const std::string& path) {
  const auto ck = ckpt::Checkpoint::open(path);
  const auto& i = ck.info();
  fmt::print("checkpoint {}\n  run {}, step {}, {} ranks, {}\n  layout {}\n  model  {}\n  data   {}\n  metrics {}\n",
             path, i.run_id, i.step, i.world_size, human(static_cast<double>(ck.total_bytes())), i.layout, i.model,
             i.data, i.metrics);
  fmt::print("  {} tensors:\n", ck.tensors().size());
  for (const auto& [name, t] : ck.tensors()) {
    fmt::print("    {:<56} {:<8} [{}]  {} piece(s)\n", name, c10::toString(t.dtype), fmt::join(t.shape, ", "),
               t.pieces);
  }
  return 0;
}

int cmd_verify(const std::vector<std::string>& paths) {
  int bad = 0;
  for (const auto& p : paths) {
    try {
      const auto ck = ckpt::Checkpoint::open(p);
      ck.verify();
      for (const auto& [name, t] : ck.tensors()) (void)ck.read_full(name);  // every tensor fully covered
      fmt::print("{}: OK (step {}, {} tensors, {})\n", p, ck.info().step, ck.tensors().size(),
                 human(static_cast<double>(ck.total_bytes())));
    } catch (const ckpt::CheckpointError& e) {
      fmt::print("{}: BAD: {}\n", p, e.what());
      ++bad;
    }
  }
  return bad == 0 ? 0 : 1;
}

int cmd_export(const std::string& path, const std::string& out, const std::string& prefix) {
  const auto ck = ckpt::Checkpoint::open(path);
  ck.verify();
  const int64_t n = ckpt::export_safetensors(ck, out, prefix);
  fmt::print("{}: {} tensors of step {} written to {}\n", path, n, ck.info().step, out);
  return 0;
}

int cmd_export_hf(const std::string& path, const std::string& out, const std::string& dtype,
                  engine::HfExportOptions options) {
  const auto ck = ckpt::Checkpoint::open(path);
  ck.verify();
  if (dtype == "f32") {
    options.dtype = c10::ScalarType::Float;
  } else if (dtype == "bf16") {
    options.dtype = c10::ScalarType::BFloat16;
  } else if (dtype == "f16") {
    options.dtype = c10::ScalarType::Half;
  }
  const engine::HfConfig config = engine::hf_config_of_checkpoint(ck);
  const engine::HfExportReport r = engine::export_hf(ck, config, out, options);
  fmt::print("{}: step {} written to {} as a Hugging Face {} model: {} in {} ({})\n", path, ck.info().step, out,
             engine::hf_model_type(config.family), torus::format_bytes(r.total_bytes),
             r.weight_files.size() == 1 ? r.weight_files[0] : fmt::format("{} shards", r.weight_files.size()),
             r.tokenizer_files.empty() ? std::string("no tokenizer files")
                                       : fmt::format("tokenizer files from {}: {}", r.tokenizer_dir,
                                                     fmt::join(r.tokenizer_files, ", ")));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torus-ckpt: list, inspect, verify and export Torus checkpoints"};
  app.require_subcommand(1);
  std::string dir, path, out, prefix = "model.";
  std::vector<std::string> paths;
  bool all = false;
  auto* list = app.add_subcommand("list", "every checkpoint in a save directory, oldest first");
  list->add_option("dir", dir, "save directory (--save-dir of the run)")->required();
  auto* info = app.add_subcommand("info", "one checkpoint's run, layout, model, data and tensors");
  info->add_option("path", path, "checkpoint directory (step-N)")->required();
  auto* verify = app.add_subcommand("verify", "check every file's SHA-256 and header, and every tensor's pieces");
  verify->add_option("paths", paths, "checkpoint directories")->required();
  auto* exp = app.add_subcommand("export", "write one consolidated safetensors file of full tensors");
  exp->add_option("path", path, "checkpoint directory (step-N)")->required();
  exp->add_option("out", out, "output .safetensors file")->required();
  exp->add_option("--prefix", prefix, "export the tensors whose names start so, without it (default: model.)");
  exp->add_flag("--all", all, "export every tensor under its full name (optimizer state, counters)");
  std::string hf_dtype;
  auto* exp_hf = app.add_subcommand("export-hf", "write a Hugging Face directory (GPT-2 or Llama) for from_pretrained");
  exp_hf->add_option("path", path, "checkpoint directory (step-N)")->required();
  exp_hf->add_option("out", out, "output directory (created; config.json and model.safetensors or shards)")
      ->required();
  exp_hf->add_option("--dtype", hf_dtype, "the tensors' dtype in the files (default: as saved)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  engine::HfExportOptions hf_options;
  exp_hf
      ->add_option("--max-shard-size", hf_options.max_shard_bytes,
                   "largest weight file (5GB, 500MB, 2GiB, bytes); a larger model is written in shards with "
                   "model.safetensors.index.json; 0: one file (default 5GB)")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true));
  exp_hf->add_option("--tokenizer", hf_options.tokenizer_dir,
                     "copy this directory's tokenizer files (tokenizer.json, tokenizer.model, vocab.json, ...); "
                     "default: the run's --init-from directory when it has them; '-': none");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*list) return cmd_list(dir);
    if (*info) return cmd_info(path);
    if (*verify) return cmd_verify(paths);
    if (*exp) return cmd_export(path, out, all ? "" : prefix);
    if (*exp_hf) return cmd_export_hf(path, out, hf_dtype, hf_options);
  } catch (const torus::Error& e) {
    std::fprintf(stderr, "torus-ckpt: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-ckpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
