// Hugging Face config.json in and out (hf.h): the GPT-2 and Llama families
// as Torus model configurations.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "torus/engine/hf.h"

namespace torus::engine {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

// Reads typed fields of one config.json, naming the field and the file in
// every refusal.
class Fields {
 public:
  Fields(const Json& j, std::string what) : j_(j), what_(std::move(what)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key) const {
    TORUS_CHECK(has(key), InvalidArgument, "{}: {} is required", what_, key);
    return integer_of(j_[key], key);
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer_of(j_[key], key) : fallback; }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    TORUS_CHECK(j_[key].is_number(), InvalidArgument, "{}: {} must be a number, not {}", what_, key, j_[key].dump());
    return j_[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    TORUS_CHECK(j_[key].is_boolean(), InvalidArgument, "{}: {} must be true or false, not {}", what_, key,
                j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    TORUS_CHECK(j_[key].is_string(), InvalidArgument, "{}: {} must be a string, not {}", what_, key, j_[key].dump());
    return j_[key].get<std::string>();
  }
  const std::string& what() const { return what_; }

 private:
  int64_t integer_of(const Json& v, const char* key) const {
    TORUS_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, InvalidArgument,
                "{}: {} must be a non-negative integer, not {}", what_, key, v.dump());
    return v.get<int64_t>();
  }
  const Json& j_;
  std::string what_;
};

models::GPTConfig gpt2_config(const Fields& f) {
  models::GPTConfig g;
  g.hidden = f.integer("n_embd");
  g.num_layers = f.integer("n_layer");
  g.num_heads = f.integer("n_head");
  g.max_seq_len = f.integer("n_positions");
  g.vocab_size = f.integer("vocab_size");
  g.ffn_hidden = f.integer("n_inner", 0);  // null: 4h
  g.layernorm_eps = f.number("layer_norm_epsilon", 1e-5);
  g.tie_embeddings = f.boolean("tie_word_embeddings", true);
  const std::string act = f.string("activation_function", "gelu_new");
  TORUS_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", InvalidArgument,
              "{}: activation_function '{}': Torus's GPT computes gelu with the tanh approximation "
              "(gelu_new, gelu_pytorch_tanh) only",
              f.what(), act);
  TORUS_CHECK(f.boolean("scale_attn_weights", true), InvalidArgument,
              "{}: scale_attn_weights false: Torus's GPT always scales scores by 1/sqrt(head_dim)", f.what());
  TORUS_CHECK(!f.boolean("scale_attn_by_inverse_layer_idx", false), InvalidArgument,
              "{}: scale_attn_by_inverse_layer_idx true is not computed by Torus's GPT", f.what());
  TORUS_CHECK(!f.boolean("add_cross_attention", false), InvalidArgument,
              "{}: add_cross_attention true: Torus's GPT is a decoder without cross attention", f.what());
  TORUS_CHECK(g.hidden > 0 && g.num_heads > 0 && g.hidden % g.num_heads == 0, InvalidArgument,
              "{}: n_embd {} is not a multiple of n_head {}", f.what(), g.hidden, g.num_heads);
  g.dropout = 0.0;
  g.attention_dropout = 0.0;
  return g;
}

// RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta, factor,
// ...}; transformers 4 rope_theta beside rope_scaling {rope_type | type, ...}.
void read_rope(const Json& j, const Fields& f, models::LlamaConfig& l) {
  const bool v5 = f.has("rope_parameters");
  const Json none = Json::object();
  const Json& p = v5 ? j["rope_parameters"] : (f.has("rope_scaling") ? j["rope_scaling"] : none);
  const char* field = v5 ? "rope_parameters" : "rope_scaling";
  TORUS_CHECK(p.is_object(), InvalidArgument, "{}: {} must be an object, not {}", f.what(), field, p.dump());
  for (const auto& [k, v] : p.items()) {
    TORUS_CHECK(!v.is_object(), InvalidArgument,
                "{}: {} holds per-layer-type parameters ('{}'): Torus's Llama has one RoPE for every layer", f.what(),
                field, k);
  }
  const Fields rf(p, f.what() + " " + field);
  l.rope_theta = v5 ? rf.number("rope_theta", f.number("rope_theta", 10000.0)) : f.number("rope_theta", 10000.0);
  const std::string type = rf.string("rope_type", rf.string("type", "default"));
  if (type == "default" || p.empty()) {
    l.rope_scaling = {};
    return;
  }
  TORUS_CHECK(type == "linear" || type == "llama3", InvalidArgument,
              "{}: {} type '{}': Torus's Llama computes RoPE without scaling (default), or with linear or llama3 "
              "scaling only",
              f.what(), field, type);
  l.rope_scaling.type = type;
  TORUS_CHECK(rf.has("factor"), InvalidArgument, "{}: {} type {} needs a factor", f.what(), field, type);
  l.rope_scaling.factor = rf.number("factor", 1.0);
  if (type == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      TORUS_CHECK(rf.has(k), InvalidArgument, "{}: {} type llama3 needs {}", f.what(), field, k);
    }
    l.rope_scaling.low_freq_factor = rf.number("low_freq_factor", 1.0);
    l.rope_scaling.high_freq_factor = rf.number("high_freq_factor", 4.0);
    l.rope_scaling.original_max_position = rf.integer("original_max_position_embeddings");
  }
}

models::LlamaConfig llama_config(const Json& j, const Fields& f) {
  models::LlamaConfig l;
  l.hidden = f.integer("hidden_size");
  l.num_layers = f.integer("num_hidden_layers");
  l.num_heads = f.integer("num_attention_heads");
  l.num_kv_heads = f.integer("num_key_value_heads", l.num_heads);
  l.head_dim = f.integer("head_dim", 0);
  TORUS_CHECK(l.num_heads > 0 && (l.head_dim > 0 || l.hidden % l.num_heads == 0), InvalidArgument,
              "{}: hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim)", f.what(), l.hidden,
              l.num_heads);
  if (l.head_dim == 0) l.head_dim = l.hidden / l.num_heads;
  l.ffn_hidden = f.integer("intermediate_size");
  l.vocab_size = f.integer("vocab_size");
  l.max_seq_len = f.integer("max_position_embeddings", 2048);
  l.rms_eps = f.number("rms_norm_eps", 1e-6);
  l.tie_embeddings = f.boolean("tie_word_embeddings", false);
  const std::string act = f.string("hidden_act", "silu");
  TORUS_CHECK(act == "silu", InvalidArgument, "{}: hidden_act '{}': Torus's Llama computes SwiGLU with silu only",
              f.what(), act);
  TORUS_CHECK(!f.boolean("attention_bias", false), InvalidArgument,
              "{}: attention_bias true: Torus's Llama has no attention biases", f.what());
  TORUS_CHECK(!f.boolean("mlp_bias", false), InvalidArgument, "{}: mlp_bias true: Torus's Llama has no MLP biases",
              f.what());
  read_rope(j, f, l);
  return l;
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: throw InvalidArgument(fmt::format("hf: no config.json dtype for {}", c10::toString(t)));
  }
}

}  // namespace

std::string hf_model_type(HfFamily family) { return family == HfFamily::kGPT2 ? "gpt2" : "llama"; }

HfConfig parse_hf_config(const std::string& json_text, const std::string& what) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON ({})", what, e.what()));
  }
  TORUS_CHECK(j.is_object(), InvalidArgument, "{}: not a JSON object", what);
  const Fields f(j, what);
  const std::string type = f.string("model_type", "");
  HfConfig c;
  c.dtype = f.string("torch_dtype", f.string("dtype", ""));
  if (type == "gpt2") {
    c.family = HfFamily::kGPT2;
    c.gpt = gpt2_config(f);
  } else if (type == "llama") {
    c.family = HfFamily::kLlama;
    c.llama = llama_config(j, f);
  } else {
    throw InvalidArgument(fmt::format("{}: model_type '{}': Torus reads Hugging Face models of type gpt2 and llama",
                                      what, type));
  }
  return c;
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  TORUS_CHECK(in.good(), ckpt::CheckpointError, "hf: cannot read {}", path);
  std::ostringstream s;
  s << in.rdbuf();
  return parse_hf_config(s.str(), path);
}

std::string hf_config_json(const HfConfig& c, c10::ScalarType dtype) {
  OJson j;
  if (c.family == HfFamily::kGPT2) {
    const models::GPTConfig& g = c.gpt;
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = g.vocab_size;
    j["n_positions"] = g.max_seq_len;
    j["n_embd"] = g.hidden;
    j["n_layer"] = g.num_layers;
    j["n_head"] = g.num_heads;
    j["n_inner"] = g.ffn_hidden > 0 ? OJson(g.ffn_hidden) : OJson(nullptr);
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = g.layernorm_eps;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["initializer_range"] = g.init_std;
    j["tie_word_embeddings"] = g.tie_embeddings;
  } else {
    const models::LlamaConfig& l = c.llama;
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = l.vocab_size;
    j["hidden_size"] = l.hidden;
    j["intermediate_size"] = l.ffn();
    j["num_hidden_layers"] = l.num_layers;
    j["num_attention_heads"] = l.num_heads;
    j["num_key_value_heads"] = l.kv_heads();
    j["head_dim"] = l.dim_per_head();
    j["max_position_embeddings"] = l.max_seq_len;
    j["rms_norm_eps"] = l.rms_eps;
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = l.init_std;
    // transformers 4's fields; transformers 5 reads them into rope_parameters.
    j["rope_theta"] = l.rope_theta;
    if (l.rope_scaling.type == "none") {
      j["rope_scaling"] = nullptr;
    } else {
      OJson r = {{"rope_type", l.rope_scaling.type}, {"factor", l.rope_scaling.factor}};
      if (l.rope_scaling.type == "llama3") {
        r["low_freq_factor"] = l.rope_scaling.low_freq_factor;
        r["high_freq_factor"] = l.rope_scaling.high_freq_factor;
        r["original_max_position_embeddings"] = l.rope_scaling.original_max_position;
      }
      j["rope_scaling"] = r;
    }
    j["tie_word_embeddings"] = l.tie_embeddings;
  }
  j["torch_dtype"] = dtype_name(dtype);  // transformers 4
  j["dtype"] = dtype_name(dtype);        // transformers 5
  return j.dump(2) + "\n";
}

}  // namespace torus::engine
