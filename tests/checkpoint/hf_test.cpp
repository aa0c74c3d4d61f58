// Hugging Face weights in and out (engine/hf.h) and the memory-mapped reader
// (checkpoint/mapped_safetensors.h).
//  np1: the mapped reader equals read_safetensors; sharded directories and
//       corrupt indexes; config.json of both families (transformers 4 and 5
//       RoPE fields, refusals); GPT-2: an HF directory written from a Torus
//       GPT's weights by a plain transform here loads back exactly into a
//       model of another seed, with logits equal (1e-5) to a plain GPT-2
//       forward over the HF tensors; missing and mis-shaped tensors name
//       both sides; export of a checkpoint and import back; the Llama
//       mapping both ways on plain tensors.
//  np2: the same GPT-2 directory into tp2 (padded vocabulary), pp2 (the
//       tied copy of the embedding) and dp2 ZeRO-3 (flat ranges).
#include <ATen/Functions.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "parallel/parallel_test_util.h"
#include "support/job_dir.h"
#include "torus/checkpoint/checkpoint.h"
#include "torus/checkpoint/mapped_safetensors.h"
#include "torus/engine/checkpointing.h"
#include "torus/engine/gpt_model.h"
#include "torus/engine/hf.h"

namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

namespace fs = std::filesystem;
using testing::world;
using Tensors = std::map<std::string, at::Tensor>;

std::string job_dir(const std::string& name) { return testing::job_dir("torus_hf", name); }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

models::GPTConfig tiny_gpt(uint64_t seed) {
  models::GPTConfig g = models::GPTConfig::tiny();  // 2 layers, width 32, 4 heads, seq 16, vocab 61
  g.seed = seed;
  return g;
}

std::string gpt2_config_json(const models::GPTConfig& g, int64_t n_positions) {
  return fmt::format(R"({{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": {},
    "n_positions": {}, "n_embd": {}, "n_layer": {}, "n_head": {}, "n_inner": null,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "tie_word_embeddings": true,
    "torch_dtype": "float32"}})",
                     g.vocab_size, n_positions, g.hidden, g.num_layers, g.num_heads);
}

// GPT-2's tensors of Torus full tensors, written out element by element
// here (independent of hf.cpp's views): Conv1D weights [in, out], c_attn
// columns [q | k | v] each [head][d]; the key bias random (it must not
// matter); the mask buffers HF keeps.
Tensors plain_gpt2_tensors(const models::GPTConfig& g, const Tensors& t, const std::string& prefix,
                           int64_t n_positions) {
  const int64_t h = g.hidden, H = g.num_heads, hd = g.head_dim();
  Tensors o;
  o[prefix + "wte.weight"] = t.at("embedding.word.weight").clone();
  at::Tensor wpe = testing::same_randn({n_positions, h}, 7);
  wpe.narrow(0, 0, g.max_seq_len).copy_(t.at("embedding.position"));
  o[prefix + "wpe.weight"] = wpe;
  for (int64_t i = 0; i < g.num_layers; ++i) {
    const std::string b = fmt::format("blocks.{}.", i), p = fmt::format("{}h.{}.", prefix, i);
    o[p + "ln_1.weight"] = t.at(b + "ln1.weight").clone();
    o[p + "ln_1.bias"] = t.at(b + "ln1.bias").clone();
    o[p + "ln_2.weight"] = t.at(b + "ln2.weight").clone();
    o[p + "ln_2.bias"] = t.at(b + "ln2.bias").clone();
    const at::Tensor qkv = t.at(b + "qkv.weight"), qv = t.at(b + "qv_bias");
    at::Tensor w = at::empty({h, 3 * h}), bias = testing::same_randn({3 * h}, 11 + i);
    auto wa = w.accessor<float, 2>();
    auto qa = qkv.accessor<float, 2>();
    auto ba = bias.accessor<float, 1>();
    auto va = qv.accessor<float, 3>();
    for (int64_t head = 0; head < H; ++head) {
      for (int64_t j = 0; j < 3; ++j) {
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t col = j * h + head * hd + d, row = (head * 3 + j) * hd + d;
          for (int64_t in = 0; in < h; ++in) wa[in][col] = qa[row][in];
          if (j != 1) ba[col] = va[head][j == 0 ? 0 : 1][d];
        }
      }
    }
    o[p + "attn.c_attn.weight"] = w;
    o[p + "attn.c_attn.bias"] = bias;
    o[p + "attn.c_proj.weight"] = t.at(b + "proj.weight").t().contiguous();
    o[p + "attn.c_proj.bias"] = t.at(b + "proj.bias").clone();
    o[p + "mlp.c_fc.weight"] = t.at(b + "fc1.weight").t().contiguous();
    o[p + "mlp.c_fc.bias"] = t.at(b + "fc1.bias").clone();
    o[p + "mlp.c_proj.weight"] = t.at(b + "fc2.weight").t().contiguous();
    o[p + "mlp.c_proj.bias"] = t.at(b + "fc2.bias").clone();
    o[p + "attn.bias"] = at::ones({1, 1, n_positions, n_positions}).tril();
  }
  o[prefix + "ln_f.weight"] = t.at("head.ln_f.weight").clone();
  o[prefix + "ln_f.bias"] = t.at("head.ln_f.bias").clone();
  return o;
}

// GPT-2's forward over HF-layout tensors, plainly: logits [b, s, V].
at::Tensor plain_gpt2_logits(const models::GPTConfig& g, const Tensors& w, const std::string& p,
                             const at::Tensor& tokens) {
  const int64_t b = tokens.size(0), s = tokens.size(1), h = g.hidden, H = g.num_heads, hd = g.head_dim();
  auto ln = [&](const at::Tensor& x, const std::string& n) {
    return at::layer_norm(x, {h}, w.at(n + ".weight"), w.at(n + ".bias"), 1e-5);
  };
  at::Tensor x = w.at(p + "wte.weight").index_select(0, tokens.reshape({-1})).view({b, s, h}) +
                 w.at(p + "wpe.weight").narrow(0, 0, s);
  const at::Tensor causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool)).triu(1);
  for (int64_t i = 0; i < g.num_layers; ++i) {
    const std::string l = fmt::format("{}h.{}.", p, i);
    at::Tensor qkv = at::matmul(ln(x, l + "ln_1"), w.at(l + "attn.c_attn.weight")) + w.at(l + "attn.c_attn.bias");
    auto heads = [&](int64_t j) { return qkv.narrow(2, j * h, h).view({b, s, H, hd}).transpose(1, 2); };
    at::Tensor scores = at::matmul(heads(0), heads(1).transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    at::Tensor probs = at::softmax(scores.masked_fill(causal, -INFINITY), -1);
    at::Tensor ctx = at::matmul(probs, heads(2)).transpose(1, 2).reshape({b, s, h});
    x = x + at::matmul(ctx, w.at(l + "attn.c_proj.weight")) + w.at(l + "attn.c_proj.bias");
    at::Tensor m = at::gelu(at::matmul(ln(x, l + "ln_2"), w.at(l + "mlp.c_fc.weight")) + w.at(l + "mlp.c_fc.bias"),
                            "tanh");
    x = x + at::matmul(m, w.at(l + "mlp.c_proj.weight")) + w.at(l + "mlp.c_proj.bias");
  }
  return at::matmul(ln(x, p + "ln_f"), w.at(p + "wte.weight").t());
}

// A Torus tiny GPT's full weights, and an HF directory made of them.
struct Gpt2Dir {
  models::GPTConfig config;
  Tensors torus;  // bare global names
  Tensors hf;
  std::string dir;
};

Gpt2Dir make_gpt2_dir(const std::string& name, const std::string& prefix, int64_t n_positions = 20) {
  Gpt2Dir d;
  d.config = tiny_gpt(1234);
  d.dir = job_dir(name);
  {
    GPTTrainer ref(world()->split(world()->rank(), 0, "self"), d.config, {});
    d.torus = ref.gather_local_parameters();
  }
  d.hf = plain_gpt2_tensors(d.config, d.torus, prefix, n_positions);
  if (world()->rank() == 0) {
    ckpt::write_safetensors(d.dir + "/model.safetensors", d.hf);
    write_text(d.dir + "/config.json", gpt2_config_json(d.config, n_positions));
  }
  if (world()->size() > 1) world()->barrier()->wait();
  return d;
}

void expect_same(const Tensors& got, const Tensors& want) {
  ASSERT_FALSE(got.empty());
  for (const auto& [name, t] : got) {
    auto it = want.find(name);
    // A tied model's last pipeline stage holds a copy of the embedding.
    if (it == want.end() && name == "head.output") it = want.find("embedding.word.weight");
    ASSERT_NE(it, want.end()) << name;
    EXPECT_TRUE(at::equal(t, it->second)) << name;
  }
}

// --- the mapped reader -----------------------------------------------------------

TEST(MappedSafetensors, EqualsReadSafetensors) {
  const std::string dir = job_dir("mapped");
  Tensors t = {{"a", testing::same_randn({3, 5}, 1)},
               {"b", testing::same_randn({7}, 2).to(at::kBFloat16)},
               {"c", at::arange(10, at::TensorOptions().dtype(at::kLong))},
               {"empty", at::empty({0, 4})},
               {"h", testing::same_randn({2, 2, 2}, 3).to(at::kHalf)}};
  const std::string path = dir + "/x.safetensors";
  ckpt::write_safetensors(path, t);
  const Tensors ref = ckpt::read_safetensors(path);
  at::Tensor kept;
  {
    auto m = ckpt::MappedSafetensors::open(path);
    EXPECT_EQ(m->names().size(), t.size());
    for (const auto& [name, r] : ref) {
      const at::Tensor v = m->tensor(name);
      EXPECT_EQ(v.scalar_type(), r.scalar_type()) << name;
      EXPECT_TRUE(at::equal(v, r)) << name;
    }
    kept = m->tensor("a").t();  // a view of a view
    EXPECT_HAS(error_of([&] { m->tensor("nope"); }), "no tensor 'nope'");
  }
  EXPECT_TRUE(at::equal(kept, ref.at("a").t()));  // the mapping outlives the reader
  // A single-file directory.
  fs::copy_file(path, dir + "/model.safetensors");
  const auto d = ckpt::MappedWeightDir::open(dir);
  EXPECT_EQ(d.files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(at::equal(d.tensor("c"), ref.at("c")));
}

TEST(MappedSafetensors, ShardedDirectoryAndCorruptIndexes) {
  const std::string dir = job_dir("sharded");
  ckpt::write_safetensors(dir + "/s1.safetensors", {{"w1", testing::same_randn({4}, 1)}, {"extra", at::ones({1})}});
  ckpt::write_safetensors(dir + "/s2.safetensors", {{"w2", testing::same_randn({2, 3}, 2)}});
  const std::string index = dir + "/model.safetensors.index.json";
  write_text(index, R"({"metadata": {"total_size": 40}, "weight_map": {"w1": "s1.safetensors", "w2": "s2.safetensors"}})");
  const auto d = ckpt::MappedWeightDir::open(dir);
  EXPECT_EQ(d.names(), (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(d.files(), (std::vector<std::string>{"s1.safetensors", "s2.safetensors"}));
  EXPECT_TRUE(at::equal(d.tensor("w2"), testing::same_randn({2, 3}, 2)));
  EXPECT_FALSE(d.contains("extra"));  // not in the weight map

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"weight_map": {"w1": "../s1.safetensors"}})", "not a plain file name"},
      {R"({"weight_map": {"w1": "sub/s1.safetensors"}})", "not a plain file name"},
      {R"({"weight_map": {"w1": ".."}})", "not a plain file name"},
      {R"({"weight_map": {"w1": ""}})", "not a plain file name"},
      {R"({"weight_map": {"w1": "/etc/passwd"}})", "not a plain file name"},
      {R"({"weight_map": {"w1": "s3.safetensors"}})", "missing"},
      {R"({"weight_map": {"w2": "s1.safetensors"}})", "has no such tensor"},
      {R"({"weight_map": {"w1": 3}})", "not a string"},
      {R"({"weight_map": ["w1"]})", "weight_map"},
      {R"({"weight_map": {}})", "empty weight_map"},
      {R"({"weight_map": {"w1": "s1.safetensors", "w1": "s2.safetensors"}})", "appears twice"},
      {R"({"weight_map": {"w1": "s1.safetensors")", "not valid JSON"},
      {R"([1, 2])", "weight_map"},
  };
  for (const auto& [text, why] : bad) {
    write_text(index, text);
    EXPECT_HAS(error_of([&] { ckpt::MappedWeightDir::open(dir); }), why);
  }
  // A shard that is not safetensors.
  write_text(dir + "/s3.safetensors", "garbage!garbage!");
  write_text(index, R"({"weight_map": {"w1": "s3.safetensors"}})");
  EXPECT_NE(error_of([&] { ckpt::MappedWeightDir::open(dir); }), "(no error)");
  fs::remove(index);
  EXPECT_HAS(error_of([&] { ckpt::MappedWeightDir::open(dir); }), "has neither model.safetensors nor");
}

// --- config.json ------------------------------------------------------------------

TEST(HfConfig, Gpt2) {
  const HfConfig c = parse_hf_config(gpt2_config_json(models::GPTConfig::tiny(), 20), "config.json");
  EXPECT_EQ(c.family, HfFamily::kGPT2);
  EXPECT_EQ(c.gpt.hidden, 32);
  EXPECT_EQ(c.gpt.num_heads, 4);
  EXPECT_EQ(c.gpt.max_seq_len, 20);
  EXPECT_EQ(c.gpt.vocab_size, 61);
  EXPECT_EQ(c.gpt.ffn(), 128);
  EXPECT_TRUE(c.gpt.tie_embeddings);
  EXPECT_EQ(c.dtype, "float32");
  const std::string base = R"("model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 4,
                              "vocab_size": 5)";
  EXPECT_EQ(parse_hf_config("{" + base + R"(, "n_inner": 24})", "c").gpt.ffn(), 24);
  EXPECT_FALSE(parse_hf_config("{" + base + R"(, "tie_word_embeddings": false})", "c").gpt.tie_embeddings);
  EXPECT_HAS(error_of([&] { parse_hf_config("{" + base + R"(, "activation_function": "relu"})", "c"); }),
             "activation_function 'relu'");
  EXPECT_HAS(error_of([&] { parse_hf_config(R"({"model_type": "gpt2", "n_embd": 8})", "c"); }), "n_layer is required");
  EXPECT_HAS(error_of([&] { parse_hf_config(R"({"model_type": "bert"})", "c"); }), "model_type 'bert'");
  EXPECT_HAS(error_of([&] { parse_hf_config("{" + base + R"(, "scale_attn_by_inverse_layer_idx": true})", "c"); }),
             "scale_attn_by_inverse_layer_idx");
}

TEST(HfConfig, LlamaBothRopeForms) {
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
      "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "hidden_act": "silu")";
  const HfConfig v4 = parse_hf_config("{" + base + R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})",
                                      "c");
  EXPECT_EQ(v4.family, HfFamily::kLlama);
  EXPECT_EQ(v4.llama.kv_heads(), 2);
  EXPECT_EQ(v4.llama.dim_per_head(), 16);
  EXPECT_EQ(v4.llama.ffn(), 96);
  EXPECT_DOUBLE_EQ(v4.llama.rope_theta, 500000.0);
  EXPECT_EQ(v4.llama.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(v4.llama.rope_scaling.factor, 8.0);
  EXPECT_EQ(v4.llama.rope_scaling.original_max_position, 64);
  EXPECT_FALSE(v4.llama.tie_embeddings);
  const HfConfig v5 = parse_hf_config("{" + base + R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
      "rope_theta": 20000.0}, "head_dim": 32, "dtype": "bfloat16"})",
                                      "c");
  EXPECT_EQ(v5.llama.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(v5.llama.rope_scaling.factor, 2.0);
  EXPECT_DOUBLE_EQ(v5.llama.rope_theta, 20000.0);
  EXPECT_EQ(v5.llama.dim_per_head(), 32);
  EXPECT_EQ(v5.dtype, "bfloat16");
  const HfConfig plain =
      parse_hf_config("{" + base + R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})", "c");
  EXPECT_EQ(plain.llama.rope_scaling.type, "none");
  for (const auto& [extra, why] : std::vector<std::pair<std::string, std::string>>{
           {R"("rope_scaling": {"type": "yarn", "factor": 4.0})", "type 'yarn'"},
           {R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0})", "type 'dynamic'"},
           {R"("rope_parameters": {"full_attention": {"rope_type": "default"}})", "per-layer-type"},
           {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "needs low_freq_factor"},
           {R"("attention_bias": true)", "attention_bias"},
           {R"("mlp_bias": true)", "mlp_bias"},
           {R"("hidden_act": "gelu")", "hidden_act 'gelu'"}}) {
    std::string text = "{" + base + ", " + extra + "}";
    if (extra.rfind("\"hidden_act\"", 0) == 0) {
      text = "{" + base.substr(0, base.find(", \"hidden_act\"")) + ", " + extra + "}";
    }
    EXPECT_HAS(error_of([&] { parse_hf_config(text, "c"); }), why);
  }
  // Out and in again.
  const HfConfig back = parse_hf_config(hf_config_json(v4, at::kBFloat16), "out");
  EXPECT_EQ(back.llama.rope_scaling.type, "llama3");
  EXPECT_EQ(back.llama.rope_scaling.original_max_position, 64);
  EXPECT_DOUBLE_EQ(back.llama.rope_theta, 500000.0);
  EXPECT_EQ(back.llama.kv_heads(), 2);
  EXPECT_EQ(back.dtype, "bfloat16");
}

// --- GPT-2 weights in -----------------------------------------------------------------

TEST(HfGpt2, LoadsExactlyAndComputesGpt2sLogits) {
  for (const std::string prefix : {"transformer.", ""}) {
    const Gpt2Dir d = make_gpt2_dir("gpt2_in" + std::to_string(prefix.size()), prefix);
    GPTTrainer fresh(world(), tiny_gpt(99), {});
    load_hf_weights(fresh, d.dir);
    const Tensors got = fresh.gather_local_parameters();
    expect_same(got, d.torus);

    // Torus's forward over the loaded weights against GPT-2's, plainly.
    models::GPT gpt(tiny_gpt(5));
    gpt.eval();
    {
      at::NoGradGuard ng;
      for (auto& p : gpt.named_parameters()) p.value().copy_(got.at(p.key()));
    }
    const at::Tensor tokens = testing::same_tokens({2, 16}, 61, 3);
    at::NoGradGuard ng;
    const at::Tensor ours = gpt.forward(tokens).transpose(0, 1);  // [b, s, V]
    const at::Tensor theirs = plain_gpt2_logits(d.config, d.hf, prefix, tokens);
    EXPECT_LT((ours - theirs).abs().max().item<double>(), 1e-5) << prefix;
  }
}

TEST(HfGpt2, BF16FileIntoF32ModelAndUnusedTensors) {
  Gpt2Dir d = make_gpt2_dir("gpt2_bf16", "transformer.");
  Tensors half;
  for (const auto& [n, t] : d.hf) half[n] = t.to(at::kBFloat16);
  half["transformer.extra.weight"] = at::ones({2});
  ckpt::write_safetensors(d.dir + "/model.safetensors", half);
  const HfConfig hf = read_hf_config(d.dir);
  EXPECT_EQ(hf_unused_tensors(d.dir, hf), std::vector<std::string>{"transformer.extra.weight"});
  GPTTrainer fresh(world(), tiny_gpt(99), {});
  load_hf_weights(fresh, d.dir);
  const Tensors got = fresh.gather_local_parameters();
  EXPECT_TRUE(at::equal(got.at("embedding.word.weight"), d.torus.at("embedding.word.weight").to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(got.at("blocks.1.qkv.weight").scalar_type(), at::kFloat);
}

TEST(HfGpt2, MissingOrMisshapedTensorsNameBothSides) {
  const Gpt2Dir d = make_gpt2_dir("gpt2_bad", "transformer.");
  Tensors t = d.hf;
  t.erase("transformer.h.1.mlp.c_fc.bias");
  ckpt::write_safetensors(d.dir + "/model.safetensors", t);
  GPTTrainer fresh(world(), tiny_gpt(99), {});
  std::string e = error_of([&] { load_hf_weights(fresh, d.dir); });
  EXPECT_HAS(e, "transformer.h.1.mlp.c_fc.bias");
  EXPECT_HAS(e, "blocks.1.fc1.bias");
  t = d.hf;
  t["transformer.h.0.attn.c_proj.weight"] = at::zeros({32, 31});
  ckpt::write_safetensors(d.dir + "/model.safetensors", t);
  e = error_of([&] { load_hf_weights(fresh, d.dir); });
  EXPECT_HAS(e, "transformer.h.0.attn.c_proj.weight");
  EXPECT_HAS(e, "blocks.0.proj.weight");
  // A tied config with an lm_head that is not the embedding.
  t = d.hf;
  t["lm_head.weight"] = at::zeros({61, 32});
  ckpt::write_safetensors(d.dir + "/model.safetensors", t);
  EXPECT_HAS(error_of([&] { load_hf_weights(fresh, d.dir); }), "lm_head.weight differs");
  t["lm_head.weight"] = d.hf.at("transformer.wte.weight");
  ckpt::write_safetensors(d.dir + "/model.safetensors", t);
  load_hf_weights(fresh, d.dir);
  // Another head count is refused (the QKV layout depends on it).
  models::GPTConfig two = tiny_gpt(99);
  two.num_heads = 2;
  GPTTrainer other(world(), two, {});
  EXPECT_HAS(error_of([&] { load_hf_weights(other, d.dir); }), "n_head 4");
  // More positions than n_positions.
  models::GPTConfig longer = tiny_gpt(99);
  longer.max_seq_len = 32;
  GPTTrainer longer_trainer(world(), longer, {});
  EXPECT_HAS(error_of([&] { load_hf_weights(longer_trainer, d.dir); }), "n_positions");
}

// --- export ------------------------------------------------------------------------------

// The trainer's state saved as one checkpoint of a run described by
// `model_json` and `options_json` under `dir`; its path.
std::string save_checkpoint(GPTTrainer& trainer, const std::string& dir, std::string model_json,
                            std::string options_json) {
  RunDescription run;
  run.model = std::move(model_json);
  run.options = std::move(options_json);
  CheckpointPolicy policy;
  policy.dir = dir;
  Checkpointer saver(world(), trainer, policy, run);
  saver.save(1, "{}");
  return saver.last_path();
}

TEST(HfGpt2, ExportThenImportRoundTrip) {
  const std::string dir = job_dir("export");
  for (const bool tie : {true, false}) {
    models::GPTConfig g = tiny_gpt(77);
    g.tie_embeddings = tie;
    GPTTrainer trainer(world(), g, {});
    const Tensors want = trainer.gather_local_parameters();
    const std::string ck_dir = dir + (tie ? "/tied" : "/untied");
    const std::string path =
        save_checkpoint(trainer, ck_dir,
                        fmt::format(R"({{"model": "gpt", "layers": 2, "hidden": 32, "heads": 4, "ffn": 0,
                                       "tie_embeddings": {}}})",
                                    tie),
                        R"({"model": "gpt", "seq": 16})");
    const auto ck = ckpt::Checkpoint::open(path);
    const HfConfig hf = hf_config_of_checkpoint(ck);
    EXPECT_EQ(hf.family, HfFamily::kGPT2);
    EXPECT_EQ(hf.gpt.num_heads, 4);
    EXPECT_EQ(hf.gpt.num_layers, 2);
    EXPECT_EQ(hf.gpt.max_seq_len, 16);
    EXPECT_EQ(hf.gpt.vocab_size, 61);
    EXPECT_EQ(hf.gpt.tie_embeddings, tie);
    const std::string out = ck_dir + "/hf";
    export_hf(ck, hf, out);
    const Tensors files = ckpt::read_safetensors(out + "/model.safetensors");
    EXPECT_EQ(files.count("lm_head.weight"), tie ? 0u : 1u);
    // The key bias was dropped: zeros.
    EXPECT_EQ(files.at("transformer.h.0.attn.c_attn.bias").narrow(0, 32, 32).abs().max().item<float>(), 0.0f);
    EXPECT_TRUE(at::equal(files.at("transformer.h.1.mlp.c_fc.weight"), want.at("blocks.1.fc1.weight").t()));
    const HfConfig back = read_hf_config(out);
    EXPECT_EQ(back.gpt.tie_embeddings, tie);
    EXPECT_EQ(back.gpt.num_heads, 4);
    EXPECT_TRUE(hf_unused_tensors(out, back).empty());
    GPTTrainer fresh(world(), g.tie_embeddings ? tiny_gpt(5) : [&] {
      models::GPTConfig u = tiny_gpt(5);
      u.tie_embeddings = false;
      return u;
    }(), {});
    load_hf_weights(fresh, out);
    expect_same(fresh.gather_local_parameters(), want);
    // bf16 files.
    export_hf(ck, hf, out + "-bf16", {.dtype = at::kBFloat16});
    EXPECT_EQ(ckpt::read_safetensors(out + "-bf16/model.safetensors").at("transformer.wte.weight").scalar_type(),
              at::kBFloat16);
    EXPECT_EQ(read_hf_config(out + "-bf16").dtype, "bfloat16");
  }
}

// A model larger than --max-shard-size is written as shards and their index
// (every tensor once, each shard within the limit unless one tensor alone
// exceeds it) that the loader reads back; the tokenizer files of the run's
// --init-from directory are copied beside it; an export of one file into the
// same directory removes the shards.
TEST(HfGpt2, ShardedExportAndTokenizerFiles) {
  const std::string dir = job_dir("export-sharded");
  models::GPTConfig g = tiny_gpt(78);
  g.tie_embeddings = false;
  GPTTrainer trainer(world(), g, {});
  const Tensors want = trainer.gather_local_parameters();
  const std::string tok = dir + "/tokenizer-src";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, true);
  ASSERT_EQ(::mkdir(tok.c_str(), 0755), 0);
  const std::map<std::string, std::string> tok_files = {{"tokenizer.json", R"({"version": "1.0", "model": {}})"},
                                                         {"tokenizer_config.json", R"({"model_max_length": 16})"}};
  for (const auto& [name, text] : tok_files) std::ofstream(tok + "/" + name) << text;
  const std::string ck_dir = dir + "/ck";
  const std::string path =
      save_checkpoint(trainer, ck_dir,
                      R"({"model": "gpt", "layers": 2, "hidden": 32, "heads": 4, "ffn": 0, "tie_embeddings": false})",
                      fmt::format(R"({{"model": "gpt", "seq": 16, "init-from": "{}"}})", tok));
  const auto ck = ckpt::Checkpoint::open(path);
  const HfConfig hf = hf_config_of_checkpoint(ck);
  const std::string single = dir + "/single", sharded = dir + "/sharded";
  const HfExportReport one = export_hf(ck, hf, single, {.max_shard_bytes = 0, .tokenizer_dir = "-"});
  ASSERT_EQ(one.weight_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(one.tokenizer_files.empty());
  const Tensors whole = ckpt::read_safetensors(single + "/model.safetensors");
  const int64_t limit = 20000;
  const HfExportReport r = export_hf(ck, hf, sharded, {.max_shard_bytes = limit});
  ASSERT_GT(r.weight_files.size(), 2u);
  EXPECT_EQ(r.weight_files.front(), fmt::format("model-00001-of-{:05d}.safetensors", r.weight_files.size()));
  const std::string index_text = [&] {
    std::ifstream in(sharded + "/model.safetensors.index.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const nlohmann::json index = nlohmann::json::parse(index_text);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), r.total_bytes);
  int64_t total = 0;
  std::map<std::string, std::string> seen;
  for (const std::string& file : r.weight_files) {
    const Tensors part = ckpt::read_safetensors(sharded + "/" + file);
    int64_t bytes = 0;
    for (const auto& [name, t] : part) {
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
      EXPECT_TRUE(seen.emplace(name, file).second) << name << " in two shards";
      EXPECT_EQ(index["weight_map"][name].get<std::string>(), file) << name;
      EXPECT_TRUE(at::equal(t, whole.at(name))) << name;
    }
    EXPECT_TRUE(bytes <= limit || part.size() == 1) << file << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(seen.size(), whole.size());
  EXPECT_EQ(total, r.total_bytes);
  EXPECT_EQ(index["weight_map"].size(), whole.size());
  // The loader reads the shards through the index.
  models::GPTConfig u = tiny_gpt(5);
  u.tie_embeddings = false;
  GPTTrainer fresh(world(), u, {});
  load_hf_weights(fresh, sharded);
  expect_same(fresh.gather_local_parameters(), want);
  // The tokenizer files of the run's --init-from directory, byte for byte.
  EXPECT_EQ(r.tokenizer_dir, tok);
  ASSERT_EQ(r.tokenizer_files.size(), tok_files.size());
  for (const auto& [name, text] : tok_files) {
    std::ifstream in(sharded + "/" + name);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), text) << name;
  }
  // One file into the same directory: the shards and the index are gone.
  export_hf(ck, hf, sharded, {.max_shard_bytes = 0});
  const std::vector<std::string> left = ckpt::list_dir(sharded);
  for (const std::string& n : left) {
    EXPECT_TRUE(n.rfind("model-", 0) != 0 && n != "model.safetensors.index.json") << n << " was left";
  }
  EXPECT_TRUE(std::count(left.begin(), left.end(), "model.safetensors") == 1);
  load_hf_weights(fresh, sharded);
  expect_same(fresh.gather_local_parameters(), want);
  // An explicit tokenizer directory without tokenizer files is refused before anything is written.
  EXPECT_HAS(error_of([&] { export_hf(ck, hf, dir + "/never", {.tokenizer_dir = ck_dir}); }),
             "has no tokenizer file");
  EXPECT_FALSE(std::filesystem::exists(dir + "/never"));
}

// --- Llama, on plain tensors -------------------------------------------------------------

TEST(HfLlama, MappingBothWays) {
  const std::string dir = job_dir("llama");
  models::LlamaConfig l = models::LlamaConfig::tiny();
  l.vocab_size = 61;
  HfConfig hf;
  hf.family = HfFamily::kLlama;
  hf.llama = l;
  const int64_t h = l.hidden, f = l.ffn(), qd = l.num_heads * l.dim_per_head(), kd = l.kv_heads() * l.dim_per_head();
  Tensors torus = {{"embedding.word.weight", testing::same_randn({61, h}, 1)},
                   {"head.norm.weight", testing::same_randn({h}, 2)},
                   {"head.output", testing::same_randn({61, h}, 3)}};
  uint64_t seed = 10;
  for (int64_t i = 0; i < l.num_layers; ++i) {
    const std::string b = fmt::format("blocks.{}.", i);
    torus[b + "attn_norm.weight"] = testing::same_randn({h}, seed++);
    torus[b + "mlp_norm.weight"] = testing::same_randn({h}, seed++);
    torus[b + "q.weight"] = testing::same_randn({qd, h}, seed++);
    torus[b + "k.weight"] = testing::same_randn({kd, h}, seed++);
    torus[b + "v.weight"] = testing::same_randn({kd, h}, seed++);
    torus[b + "o.weight"] = testing::same_randn({h, qd}, seed++);
    torus[b + "gate.weight"] = testing::same_randn({f, h}, seed++);
    torus[b + "up.weight"] = testing::same_randn({f, h}, seed++);
    torus[b + "down.weight"] = testing::same_randn({h, f}, seed++);
  }
  const Tensors out = to_hf_tensors(hf, torus);
  EXPECT_EQ(out.size(), torus.size());
  EXPECT_TRUE(at::equal(out.at("model.layers.1.self_attn.k_proj.weight"), torus.at("blocks.1.k.weight")));
  EXPECT_TRUE(at::equal(out.at("lm_head.weight"), torus.at("head.output")));
  ckpt::write_safetensors(dir + "/model.safetensors", out);
  write_text(dir + "/config.json", hf_config_json(hf, at::kFloat));
  const HfConfig back = read_hf_config(dir);
  EXPECT_EQ(back.llama.num_kv_heads, l.kv_heads());
  const auto source = hf_weight_source(dir, back);
  for (const auto& [name, t] : torus) {
    const auto s = source->find(name);
    ASSERT_TRUE(s.has_value()) << name;
    EXPECT_EQ(s->shape, t.sizes().vec()) << name;
    EXPECT_TRUE(at::equal(s->read(std::vector<int64_t>(t.dim(), 0), t.sizes().vec()), t)) << name;
  }
  EXPECT_FALSE(source->find("blocks.2.q.weight").has_value());
  EXPECT_TRUE(hf_unused_tensors(dir, back).empty());
}

TEST(HfGpt2, QkvBoxesGatherTheirRows) {
  // A box of the QKV rows (a TP slice, or rows that cut a head) reads the
  // same as the full re-laid tensor narrowed.
  const Gpt2Dir d = make_gpt2_dir("gpt2_boxes", "");
  const auto source = hf_weight_source(d.dir, read_hf_config(d.dir), 16);
  const auto s = source->find("blocks.0.qkv.weight");
  ASSERT_TRUE(s.has_value());
  const at::Tensor full = d.torus.at("blocks.0.qkv.weight");
  for (const auto& [r0, n0, c0, n1] : std::vector<std::array<int64_t, 4>>{{0, 96, 0, 32}, {48, 48, 0, 32},
                                                                          {5, 17, 3, 20}}) {
    EXPECT_TRUE(at::equal(s->read({r0, c0}, {n0, n1}), full.narrow(0, r0, n0).narrow(1, c0, n1)));
  }
  const auto pos = source->find("embedding.position");
  ASSERT_TRUE(pos.has_value());
  EXPECT_EQ(pos->shape, (std::vector<int64_t>{16, 32}));
}

// --- np2: other layouts ------------------------------------------------------------------

void load_in_layout(const std::string& name, ParallelLayout layout, TrainerOptions options = {}) {
  ASSERT_EQ(world()->size(), 2) << "an np2 case (tests.cmake runs each on its world size)";
  const Gpt2Dir d = make_gpt2_dir(name, "transformer.");
  GPTTrainer fresh(world(), tiny_gpt(99), layout, {}, options);
  load_hf_weights(fresh, d.dir);
  expect_same(fresh.gather_local_parameters(), d.torus);
}

TEST(HfLayouts, TensorParallel) { load_in_layout("tp2", {.tp = 2}); }
TEST(HfLayouts, PipelineTiedCopy) { load_in_layout("pp2", {.pp = 2, .num_micro = 2}); }
TEST(HfLayouts, ZeroThree) { load_in_layout("zero3", {.dp = 2, .zero = 3}); }

}  // namespace
}  // namespace torus::train_test
