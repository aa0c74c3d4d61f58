// Torus checkpoints out as Hugging Face directories (hf.h, Note [HF
// mapping]): the inverse mapping, a checkpoint's model as an HF config, and
// export_hf.
#include <ATen/Functions.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "torus/engine/hf.h"

namespace torus::engine {
namespace {

using Json = nlohmann::json;
using Shape = std::vector<int64_t>;

const at::Tensor& need(const std::map<std::string, at::Tensor>& t, const std::string& name, const Shape& shape) {
  auto it = t.find(name);
  TORUS_CHECK(it != t.end(), ckpt::CheckpointError, "hf export: no Torus tensor '{}'", name);
  TORUS_CHECK(it->second.sizes().vec() == shape, ckpt::CheckpointError,
              "hf export: Torus tensor '{}' has shape {}, the config implies [{}]", name,
              c10::str(it->second.sizes()), fmt::join(shape, ", "));
  return it->second;
}

std::map<std::string, at::Tensor> gpt2_tensors(const models::GPTConfig& g,
                                               const std::map<std::string, at::Tensor>& t) {
  const int64_t h = g.hidden, f = g.ffn(), V = g.vocab_size, H = g.num_heads, hd = g.head_dim();
  const std::string p = "transformer.";
  std::map<std::string, at::Tensor> out;
  auto put = [&](const std::string& name, const at::Tensor& v) { out[name] = v.contiguous(); };
  put(p + "wte.weight", need(t, "embedding.word.weight", {V, h}));
  put(p + "wpe.weight", need(t, "embedding.position", {g.max_seq_len, h}));
  for (int64_t i = 0; i < g.num_layers; ++i) {
    const std::string b = fmt::format("blocks.{}.", i), o = fmt::format("{}h.{}.", p, i);
    for (const auto& [ours, theirs] : {std::pair{"ln1", "ln_1"}, std::pair{"ln2", "ln_2"}}) {
      put(o + theirs + ".weight", need(t, b + ours + ".weight", {h}));
      put(o + theirs + ".bias", need(t, b + ours + ".bias", {h}));
    }
    // Note [QKV layout]: rows [head][j][d] -> HF columns [j][head][d].
    const at::Tensor qkv = need(t, b + "qkv.weight", {3 * h, h});
    put(o + "attn.c_attn.weight", qkv.view({H, 3, hd, h}).permute({1, 0, 2, 3}).reshape({3 * h, h}).t());
    // The key bias was dropped (softmax ignores it): zeros.
    const at::Tensor qv = need(t, b + "qv_bias", {H, 2, hd});
    at::Tensor bias = at::zeros({H, 3, hd}, qv.options());
    bias.select(1, 0).copy_(qv.select(1, 0));
    bias.select(1, 2).copy_(qv.select(1, 1));
    put(o + "attn.c_attn.bias", bias.permute({1, 0, 2}).reshape({3 * h}));
    put(o + "attn.c_proj.weight", need(t, b + "proj.weight", {h, h}).t());
    put(o + "attn.c_proj.bias", need(t, b + "proj.bias", {h}));
    put(o + "mlp.c_fc.weight", need(t, b + "fc1.weight", {f, h}).t());
    put(o + "mlp.c_fc.bias", need(t, b + "fc1.bias", {f}));
    put(o + "mlp.c_proj.weight", need(t, b + "fc2.weight", {h, f}).t());
    put(o + "mlp.c_proj.bias", need(t, b + "fc2.bias", {h}));
  }
  put(p + "ln_f.weight", need(t, "head.ln_f.weight", {h}));
  put(p + "ln_f.bias", need(t, "head.ln_f.bias", {h}));
  if (!g.tie_embeddings) put("lm_head.weight", need(t, "head.output", {V, h}));
  return out;
}

std::map<std::string, at::Tensor> llama_tensors(const models::LlamaConfig& l,
                                                const std::map<std::string, at::Tensor>& t) {
  const int64_t h = l.hidden, f = l.ffn(), V = l.vocab_size, qd = l.num_heads * l.dim_per_head(),
                kd = l.kv_heads() * l.dim_per_head();
  std::map<std::string, at::Tensor> out;
  auto put = [&](const std::string& name, const at::Tensor& v) { out[name] = v.contiguous(); };
  put("model.embed_tokens.weight", need(t, "embedding.word.weight", {V, h}));
  for (int64_t i = 0; i < l.num_layers; ++i) {
    const std::string b = fmt::format("blocks.{}.", i), o = fmt::format("model.layers.{}.", i);
    put(o + "input_layernorm.weight", need(t, b + "attn_norm.weight", {h}));
    put(o + "self_attn.q_proj.weight", need(t, b + "q.weight", {qd, h}));
    put(o + "self_attn.k_proj.weight", need(t, b + "k.weight", {kd, h}));
    put(o + "self_attn.v_proj.weight", need(t, b + "v.weight", {kd, h}));
    put(o + "self_attn.o_proj.weight", need(t, b + "o.weight", {h, qd}));
    put(o + "post_attention_layernorm.weight", need(t, b + "mlp_norm.weight", {h}));
    put(o + "mlp.gate_proj.weight", need(t, b + "gate.weight", {f, h}));
    put(o + "mlp.up_proj.weight", need(t, b + "up.weight", {f, h}));
    put(o + "mlp.down_proj.weight", need(t, b + "down.weight", {h, f}));
  }
  put("model.norm.weight", need(t, "head.norm.weight", {h}));
  if (!l.tie_embeddings) put("lm_head.weight", need(t, "head.output", {V, h}));
  return out;
}

Json parse_object(const std::string& text, const std::string& what) {
  Json j = Json::parse(text.empty() ? std::string("{}") : text, nullptr, /*allow_exceptions=*/false);
  TORUS_CHECK(j.is_object(), ckpt::CheckpointError, "hf export: the manifest's {} is not a JSON object", what);
  return j;
}

// The first of `keys` that `j` has, as a number.
std::optional<double> number_of(const Json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (j.contains(k) && j[k].is_number()) return j[k].get<double>();
  }
  return std::nullopt;
}

}  // namespace

std::map<std::string, at::Tensor> to_hf_tensors(const HfConfig& config,
                                                const std::map<std::string, at::Tensor>& torus) {
  return config.family == HfFamily::kGPT2 ? gpt2_tensors(config.gpt, torus) : llama_tensors(config.llama, torus);
}

HfConfig hf_config_of_checkpoint(const ckpt::Checkpoint& ck) {
  const Json model = parse_object(ck.info().model, "model"), options = parse_object(ck.info().options, "options");
  // The family: the manifest's model JSON (Model::config_json) names it;
  // older manifests only the --model value.
  const std::string name =
      model.value("family", model.value("model", options.value("model", std::string())));
  const auto& tensors = ck.tensors();
  auto shape = [&](const std::string& n) -> const Shape& {
    auto it = tensors.find("model." + n);
    TORUS_CHECK(it != tensors.end(), ckpt::CheckpointError, "hf export: {} has no tensor 'model.{}'", ck.path(), n);
    return it->second.shape;
  };
  int64_t layers = 0;
  static const std::regex block(R"(model\.blocks\.(\d+)\..*)");
  for (const auto& [n, info] : tensors) {
    std::smatch m;
    if (std::regex_match(n, m, block)) layers = std::max<int64_t>(layers, std::stoll(m[1]) + 1);
    TORUS_CHECK(n.find(".moe.") == std::string::npos, InvalidArgument,
                "hf export: {} holds MoE blocks ('{}'): GPT-2 and Llama have dense MLPs", ck.path(), n);
  }
  const char* heads_key = model.contains("num_heads") ? "num_heads" : "heads";
  TORUS_CHECK(model.contains(heads_key) && model[heads_key].is_number_integer(), InvalidArgument,
              "hf export: the manifest of {} does not record the model's heads", ck.path());
  const int64_t heads = model[heads_key].get<int64_t>();
  const bool tied = tensors.count("model.head.output") == 0;
  HfConfig c;
  const Shape& word = shape("embedding.word.weight");
  if (name == "gpt") {
    c.family = HfFamily::kGPT2;
    models::GPTConfig& g = c.gpt;
    g.vocab_size = word[0];
    g.hidden = word[1];
    g.max_seq_len = shape("embedding.position")[0];
    g.num_layers = layers;
    g.num_heads = heads;
    const int64_t f = shape("blocks.0.fc1.weight")[0];
    g.ffn_hidden = f == 4 * g.hidden ? 0 : f;
    g.tie_embeddings = tied;
    if (auto eps = number_of(model, {"layernorm_eps"})) {
      g.layernorm_eps = *eps;
    } else if (auto eps = number_of(options, {"layernorm-eps", "layernorm_eps"})) {
      g.layernorm_eps = *eps;
    }
  } else if (name == "llama") {
    c.family = HfFamily::kLlama;
    models::LlamaConfig& l = c.llama;
    l.vocab_size = word[0];
    l.hidden = word[1];
    l.num_layers = layers;
    l.num_heads = heads;
    const int64_t q = shape("blocks.0.q.weight")[0], k = shape("blocks.0.k.weight")[0];
    TORUS_CHECK(q % heads == 0, ckpt::CheckpointError, "hf export: q rows {} are not a multiple of heads {}", q, heads);
    l.head_dim = q / heads;
    l.num_kv_heads = k / l.head_dim;
    l.ffn_hidden = shape("blocks.0.gate.weight")[0];
    l.tie_embeddings = tied;
    if (options.contains("seq") && options["seq"].is_number_integer()) l.max_seq_len = options["seq"].get<int64_t>();
    if (auto eps = number_of(options, {"rms-eps", "rms_eps", "norm-eps"})) l.rms_eps = *eps;
    if (auto theta = number_of(options, {"rope-theta", "rope_theta"})) l.rope_theta = *theta;
    if (auto v = number_of(model, {"max_seq_len"})) l.max_seq_len = static_cast<int64_t>(*v);
    if (auto v = number_of(model, {"rms_eps"})) l.rms_eps = *v;
    if (auto v = number_of(model, {"rope_theta"})) l.rope_theta = *v;
    const bool model_scaling = model.contains("rope_scaling") && model["rope_scaling"].is_object();
    if (model_scaling) {
      const Json& r = model["rope_scaling"];
      l.rope_scaling.type = r.value("type", std::string("none"));
      if (auto v = number_of(r, {"factor"})) l.rope_scaling.factor = *v;
      if (auto v = number_of(r, {"low_freq_factor"})) l.rope_scaling.low_freq_factor = *v;
      if (auto v = number_of(r, {"high_freq_factor"})) l.rope_scaling.high_freq_factor = *v;
      if (auto v = number_of(r, {"original_max_position"})) {
        l.rope_scaling.original_max_position = static_cast<int64_t>(*v);
      }
    }
    const std::string scaling = options.value("rope-scaling", options.value("rope_scaling", std::string("none")));
    if (!model_scaling && scaling != "none" && !scaling.empty()) {
      l.rope_scaling.type = scaling;
      if (auto v = number_of(options, {"rope-factor", "rope_factor"})) l.rope_scaling.factor = *v;
      if (auto v = number_of(options, {"rope-low-freq-factor"})) l.rope_scaling.low_freq_factor = *v;
      if (auto v = number_of(options, {"rope-high-freq-factor"})) l.rope_scaling.high_freq_factor = *v;
      if (auto v = number_of(options, {"rope-original-max-position"})) {
        l.rope_scaling.original_max_position = static_cast<int64_t>(*v);
      }
    }
  } else {
    throw InvalidArgument(fmt::format("hf export: the checkpoint {} holds model '{}': gpt and llama export", ck.path(),
                                      name));
  }
  return c;
}

std::vector<std::string> hf_tokenizer_files(const std::string& dir) {
  static const char* const kNames[] = {"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                       "tokenizer.model",     "vocab.json",            "merges.txt",
                                       "added_tokens.json",   "generation_config.json", "chat_template.jinja",
                                       "chat_template.json"};
  std::vector<std::string> out;
  for (const char* name : kNames) {
    struct stat st {};
    if (::stat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) out.emplace_back(name);
  }
  return out;
}

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The tokenizer directory of an export: the option, else the run's
// --init-from when it is a directory with tokenizer files.
std::string tokenizer_source(const ckpt::Checkpoint& ck, const HfExportOptions& options) {
  if (options.tokenizer_dir == "-") return {};
  if (!options.tokenizer_dir.empty()) {
    TORUS_CHECK(!hf_tokenizer_files(options.tokenizer_dir).empty(), InvalidArgument,
                "hf export: {} has no tokenizer file (tokenizer.json, tokenizer.model, vocab.json, ...)",
                options.tokenizer_dir);
    return options.tokenizer_dir;
  }
  const Json run = parse_object(ck.info().options, "options");
  const std::string init = run.value("init-from", std::string());
  if (init.empty() || !is_directory(init) || hf_tokenizer_files(init).empty()) return {};
  return init;
}

// Copies `from` to `to` atomically (temporary name, fsync, rename).
void copy_file_durable(const std::string& from, const std::string& to) {
  const std::string part = to + ".tmp";
  ::unlink(part.c_str());
  std::ifstream in(from, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw ckpt::CheckpointError(fmt::format("hf export: cannot read {}", from));
  ckpt::write_file(part, text.str());
  ckpt::rename_durable(part, to);
}

}  // namespace

HfExportReport export_hf(const ckpt::Checkpoint& ck, const HfConfig& config, const std::string& out_dir,
                         const HfExportOptions& options) {
  TORUS_CHECK(options.max_shard_bytes >= 0, InvalidArgument, "hf export: the shard size must be >= 0, got {}",
              options.max_shard_bytes);
  HfExportReport report;
  report.tokenizer_dir = tokenizer_source(ck, options);  // checked before anything is written
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw ckpt::CheckpointError(fmt::format("hf export: cannot create {}: {}", out_dir, std::strerror(errno)));
  }
  std::map<std::string, at::Tensor> hf;
  c10::ScalarType saved = at::kFloat;
  {
    std::map<std::string, at::Tensor> full;
    for (const auto& [name, info] : ck.tensors()) {
      if (name.rfind("model.", 0) != 0) continue;
      at::Tensor t = ck.read_full(name);
      saved = t.scalar_type();
      full[name.substr(6)] = options.dtype ? t.to(*options.dtype) : t;
    }
    hf = to_hf_tensors(config, full);
  }  // the Torus copies are gone before the files are written
  const c10::ScalarType dtype = options.dtype.value_or(saved);
  for (const auto& [name, t] : hf) report.total_bytes += t.numel() * static_cast<int64_t>(t.element_size());

  // Shards: tensors in name order, a new shard when the next would pass the limit.
  std::vector<std::map<std::string, at::Tensor>> shards(1);
  int64_t in_shard = 0;
  for (auto& [name, t] : hf) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (options.max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back()[name] = std::move(t);
    in_shard += bytes;
  }
  hf.clear();
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"torus_step", std::to_string(ck.info().step)}};
  const std::string dir = out_dir + "/";
  const std::string index_name = "model.safetensors.index.json";
  // config.json goes first and comes back last: a directory with one is a
  // complete export, also when an export over an earlier one fails midway.
  ::unlink((dir + "config.json").c_str());
  // Weight files of an earlier export in the other form (or another shard
  // count). POSIX calls: Note [No std::filesystem for trees] in file_io.h.
  for (const std::string& n : ckpt::list_dir(out_dir)) {
    const bool shard_file = n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos &&
                            n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
    if (shard_file || n == "model.safetensors" || n == index_name) ::unlink((dir + n).c_str());
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    ckpt::write_safetensors(dir + file, shards[i], meta);
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
    report.weight_files.push_back(file);
    shards[i].clear();
  }
  if (shards.size() > 1) {
    const Json index = {{"metadata", {{"total_size", report.total_bytes}}}, {"weight_map", weight_map}};
    const std::string part = dir + index_name + ".tmp";
    ::unlink(part.c_str());
    ckpt::write_file(part, index.dump(2) + "\n");
    ckpt::rename_durable(part, dir + index_name);
  }
  if (!report.tokenizer_dir.empty()) {
    for (const std::string& name : hf_tokenizer_files(report.tokenizer_dir)) {
      copy_file_durable(report.tokenizer_dir + "/" + name, dir + name);
      report.tokenizer_files.push_back(name);
    }
  }
  const std::string cfg = dir + "config.json";
  const std::string part = cfg + ".tmp";
  ::unlink(part.c_str());
  ckpt::write_file(part, hf_config_json(config, dtype));
  ckpt::rename_durable(part, cfg);
  return report;
}

}  // namespace torus::engine
