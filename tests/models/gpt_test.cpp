// The reference GPT in one process: configuration checks, bad layouts
// rejected before any communication, shapes, tied and untied heads, pipeline
// parts that compose to the whole model, vocabulary padding that never
// changes the loss, layout-independent initialisation (TP shards built
// without communication are slices of the TP=1 weights), and dropout.
#include "torus/models/gpt.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/parallel_test_util.h"
#include "torus/parallel/tensor/sharding.h"

namespace torus::models {
namespace {

using testing::no_comm_group;
using testing::rel_diff;
using testing::same_tokens;

parallel::ParallelGroups no_comm_tp(int rank, int size) {
  parallel::ParallelGroups g;
  g.tp = no_comm_group(rank, size);
  return g;
}

TEST(GPTConfig, Validates) {
  GPTConfig c = GPTConfig::tiny();
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_NO_THROW(c.validate(2));
  EXPECT_NO_THROW(c.validate(4));
  EXPECT_THROW(c.validate(3), InvalidArgument);  // 4 heads over 3 ranks
  EXPECT_THROW(c.validate(8), InvalidArgument);
  GPTConfig odd = c;
  odd.hidden = 30;
  EXPECT_THROW(odd.validate(1), InvalidArgument);
  GPTConfig drop = c;
  drop.dropout = 1.0;
  EXPECT_THROW(drop.validate(1), InvalidArgument);
  EXPECT_NO_THROW(GPTConfig::small().validate(2));
  EXPECT_NO_THROW(GPTConfig::gpt2().validate(4));
  GPTConfig sp = c;
  sp.sequence_parallel = true;
  EXPECT_NO_THROW(sp.validate_sequence(16, 4));
  EXPECT_THROW(sp.validate_sequence(15, 2), InvalidArgument);
  EXPECT_THROW(c.validate_sequence(17, 1), InvalidArgument);
}

TEST(GPT, BadLayoutsFailBeforeAnyCommunication) {
  GPTConfig c = GPTConfig::tiny();
  EXPECT_THROW(GPT(c, no_comm_tp(0, 3)), InvalidArgument);  // heads % tp
  c.sequence_parallel = true;
  GPT model(c, no_comm_tp(1, 2));  // construction communicates nothing
  EXPECT_THROW(model.forward(same_tokens({2, 15}, c.vocab_size, 1)), InvalidArgument);  // seq % tp
  EXPECT_THROW(model.forward(same_tokens({2, 17}, c.vocab_size, 1)), InvalidArgument);  // seq > max
  at::Tensor bad = same_tokens({2, 16}, c.vocab_size, 1);
  bad[0][3] = c.vocab_size;
  EXPECT_THROW(model.forward(bad), InvalidArgument);
  // A valid input goes on to communicate (and hits the no-comm group).
  EXPECT_THROW(model.forward(same_tokens({2, 16}, c.vocab_size, 1)), CommError);
}

TEST(GPT, ShapesAndInitialLoss) {
  GPTConfig c = GPTConfig::tiny();
  GPT model(c);
  at::Tensor tokens = same_tokens({3, 12}, c.vocab_size, 2);
  at::Tensor logits = model.forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{12, 3, c.vocab_size}));
  at::Tensor loss = model.loss(tokens, same_tokens({3, 12}, c.vocab_size, 3));
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item<double>(), std::log(static_cast<double>(c.vocab_size)), 0.3);
  loss.backward();
  for (const auto& p : model.named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
}

TEST(GPT, TiedAndUntiedHeads) {
  GPTConfig c = GPTConfig::tiny();
  GPT tied(c);
  EXPECT_TRUE(tied.head()->output_weight().is_same(tied.embedding()->word()->weight()));
  EXPECT_FALSE(tied.named_parameters().contains("head.output"));
  c.tie_embeddings = false;
  GPT untied(c);
  ASSERT_TRUE(untied.named_parameters().contains("head.output"));
  EXPECT_FALSE(at::equal(untied.named_parameters()["head.output"], untied.embedding()->word()->weight()));
}

TEST(GPT, PipelinePartsComposeToTheWholeModel) {
  GPTConfig c = GPTConfig::tiny();
  GPT whole(c);
  GPT first(c, {}, {.embedding = true, .first_layer = 0, .num_layers = 1, .head = false});
  GPT last(c, {}, {.embedding = false, .first_layer = 1, .num_layers = 1, .head = true});
  EXPECT_EQ(first.head(), nullptr);
  EXPECT_EQ(last.embedding(), nullptr);
  EXPECT_TRUE(last.named_parameters().contains("blocks.1.qkv.weight"));
  // The last part's copy of the tied embedding starts equal to the word embedding.
  EXPECT_TRUE(at::equal(last.named_parameters()["head.output"], whole.embedding()->word()->weight()));
  at::Tensor tokens = same_tokens({2, 16}, c.vocab_size, 4);
  EXPECT_LE(rel_diff(last.forward(first.forward(tokens)), whole.forward(tokens)), 1e-6);
  EXPECT_THROW(first.loss(tokens, tokens), InvalidArgument);
  EXPECT_THROW(GPT(c, {}, {.first_layer = 1, .num_layers = 2}), InvalidArgument);
}

TEST(GPT, VocabularyPaddingNeverChangesTheLoss) {
  GPTConfig c = GPTConfig::tiny();
  c.tie_embeddings = false;
  GPTConfig padded = c;
  padded.vocab_pad_multiple = 8;  // 61 -> 64 rows
  GPT a(c), b(padded);
  EXPECT_EQ(b.padded_vocab(), 64);
  at::Tensor tokens = same_tokens({2, 16}, c.vocab_size, 5), labels = same_tokens({2, 16}, c.vocab_size, 6);
  at::Tensor la = a.loss(tokens, labels), lb = b.loss(tokens, labels);
  EXPECT_LE(rel_diff(lb, la), 1e-6);
  la.backward();
  lb.backward();
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& p : pa) {
    at::Tensor gb = pb[p.key()].grad();
    if (gb.size(0) != p.value().size(0)) {
      EXPECT_EQ(gb.narrow(0, 61, gb.size(0) - 61).abs().max().item<double>(), 0.0) << p.key();
      gb = gb.narrow(0, 0, 61);
    }
    EXPECT_LE(rel_diff(gb, p.value().grad()), 1e-5) << p.key();
  }
}

// Shards of every TP rank, built in one process (construction needs no
// communication), put back together equal the TP=1 model exactly.
TEST(GPT, ShardsOfEveryRankAreSlicesOfTheSingleProcessModel) {
  for (bool sp : {false, true}) {
    GPTConfig c = GPTConfig::tiny();
    c.sequence_parallel = sp;
    c.tie_embeddings = false;
    GPT single(c);
    for (int n : {2, 4}) {
      std::vector<std::shared_ptr<GPT>> ranks;
      for (int r = 0; r < n; ++r) ranks.push_back(std::make_shared<GPT>(c, no_comm_tp(r, n)));
      const tp::ShardSpecs specs = tp::collect_shard_specs(*ranks[0]);
      for (const auto& p : single.named_parameters()) {
        SCOPED_TRACE(p.key() + " tp=" + std::to_string(n));
        const tp::ShardSpec spec = specs.count(p.key()) ? specs.at(p.key()) : tp::ShardSpec{};
        if (!spec.sharded()) {
          EXPECT_TRUE(at::equal(ranks[n - 1]->named_parameters()[p.key()], p.value()));
          continue;
        }
        std::vector<at::Tensor> shards;
        for (auto& m : ranks) shards.push_back(m->named_parameters()[p.key()]);
        at::Tensor full = at::cat(shards, spec.dim);
        if (spec.full_size >= 0) full = full.narrow(spec.dim, 0, spec.full_size);
        EXPECT_TRUE(at::equal(full, p.value()));
      }
      // Sequence-parallel replicated parameters are flagged for the DP wrapper.
      EXPECT_EQ(specs.at("blocks.0.ln1.weight").tp_partial_grad, sp);
      EXPECT_EQ(specs.at("embedding.position").tp_partial_grad, sp);
      EXPECT_EQ(specs.at("blocks.1.fc2.bias").tp_partial_grad, sp);
      EXPECT_FALSE(specs.at("blocks.1.fc1.bias").tp_partial_grad);
    }
  }
}

TEST(GPT, DropoutIsSeededAndOffInEval) {
  GPTConfig c = GPTConfig::tiny();
  c.dropout = 0.2;
  c.attention_dropout = 0.2;
  GPT a(c), b(c);
  GPTConfig plain_config = GPTConfig::tiny();
  GPT plain(plain_config);
  at::Tensor tokens = same_tokens({2, 16}, c.vocab_size, 7), labels = same_tokens({2, 16}, c.vocab_size, 8);
  at::Tensor la = a.loss(tokens, labels);
  EXPECT_EQ(la.item<double>(), b.loss(tokens, labels).item<double>());  // same seed, same masks
  EXPECT_NE(la.item<double>(), a.loss(tokens, labels).item<double>());  // the stream moves on
  a.eval();
  EXPECT_LE(rel_diff(a.loss(tokens, labels), plain.loss(tokens, labels)), 1e-6);
}

}  // namespace
}  // namespace torus::models
