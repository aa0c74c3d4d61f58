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
    g.dtype = c.precision == "f64"    ? at::kDouble
              : c.precision == "bf16" ? at::kBFloat16
              : c.precision == "fp16" ? at::kHalf
                                      : at::kFloat;
    return std::make_shared<GPTModel>(g);
  }
  throw InvalidArgument("--model: unknown model '" + c.model + "' (known: gpt)");
}

}  // namespace torus::train
