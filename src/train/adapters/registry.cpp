// Model adapters by name (model.h: make_model).
#include <c10/core/ScalarType.h>

#include "core/log.h"
#include "torus/train/gpt_model.h"
#include "torus/recompute/recompute.h"
#include "torus/train/model.h"

namespace torus::train {

std::shared_ptr<Model> make_model(const RunConfig& c) {
  c.validate();
  if (c.model == "gpt") {
    models::GPTConfig g;
    g.vocab_size = 256;  // byte-level
    g.max_seq_len = c.seq;
    g.num_layers = c.layers;
    g.hidden = c.hidden;
    g.num_heads = c.heads;
    g.ffn_hidden = c.ffn;
    g.dropout = c.dropout;
    g.attention_dropout = c.dropout;
    g.tie_embeddings = c.tie_embeddings;
    g.seed = static_cast<uint64_t>(c.seed);
    g.recompute = recompute::Policy::parse(c.recompute);
    g.moe_every = c.moe_every;
    g.moe.num_experts = c.experts;
    g.moe.top_k = c.top_k;
    g.moe.capacity_factor = c.capacity_factor;
    g.moe.aux_loss_weight = c.aux_loss_weight >= 0 ? c.aux_loss_weight : (c.aux_loss_free ? 0.0 : 1e-2);
    g.moe.z_loss_weight = c.z_loss_weight;
    g.moe.aux_loss_free = c.aux_loss_free;
    g.moe.bias_update_rate = c.bias_update_rate;
    g.moe.jitter = c.moe_jitter;
    g.moe.ffn_hidden = c.moe_ffn;
    g.dtype = c.precision == "f64"    ? at::kDouble
              : c.precision == "bf16" ? at::kBFloat16
              : c.precision == "fp16" ? at::kHalf
                                      : at::kFloat;
    return std::make_shared<GPTModel>(g);
  }
  throw InvalidArgument("--model: unknown model '" + c.model + "' (known: gpt)");
}

}  // namespace torus::train
