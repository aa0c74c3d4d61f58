"""The reference GPT as a ``torch.nn.Module`` built from ``torus.parallel``.

It is the Python twin of the C++ ``torus::models::GPT`` (torus/models/gpt.h):
the same structure, parameter names and layout-independent initial values
(each parameter is drawn from ``derive_seed(config.seed, <its name>)``), so
both give the same losses for the same seed. Activations are sequence-first,
``[s, b, h]``; logits are ``[s, b, padded_vocab / tp]`` and the loss is the
vocab-parallel cross entropy (no logit gather).

    cfg = torus.models.GPTConfig.tiny()
    model = torus.models.GPT(cfg, groups)          # groups: ParallelGroups (or None)
    loss = model.loss(tokens, labels)              # tokens, labels: [b, s] int64
"""

import dataclasses
import math

import torch

from . import _C
from . import parallel as P

__all__ = ["GPT", "GPTConfig", "MoEConfig"]


@dataclasses.dataclass
class MoEConfig:
    """The MoE layers of a GPT with ``moe_every > 0`` (C++ torus::expert::MoEConfig, docs/moe.md)."""

    num_experts: int = 8
    top_k: int = 2
    capacity_factor: float = 0.0  # 0: dropless
    aux_loss_weight: float = 0.01
    z_loss_weight: float = 0.0
    aux_loss_free: bool = False
    bias_update_rate: float = 1e-3
    jitter: float = 0.0
    normalize_gates: bool = True
    expert_tensor_parallel: bool = False  # split each expert's MLP over TP
    ffn_hidden: int = 0  # 0: the GPT's ffn

    def to_native(self):
        c = _C.models.MoEConfig()
        for f in dataclasses.fields(self):
            setattr(c, f.name, getattr(self, f.name))
        return c


@dataclasses.dataclass
class GPTConfig:
    vocab_size: int = 50257
    max_seq_len: int = 1024
    num_layers: int = 12
    hidden: int = 768
    num_heads: int = 12
    ffn_hidden: int = 0  # 0: 4 * hidden
    dropout: float = 0.0
    attention_dropout: float = 0.0
    layernorm_eps: float = 1e-5
    tie_embeddings: bool = True
    sequence_parallel: bool = False
    vocab_pad_multiple: int = 1
    init_std: float = 0.02
    seed: int = 1234
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    recompute: str = "none"  # activation recompute of the C++ GPT: none | full | every:K | selective
    # Mixture of experts (C++ GPT only): every moe_every-th block has an MoE MLP; 0: dense.
    moe_every: int = 0
    moe: MoEConfig = dataclasses.field(default_factory=MoEConfig)

    @property
    def ffn(self):
        return self.ffn_hidden if self.ffn_hidden > 0 else 4 * self.hidden

    @property
    def head_dim(self):
        return self.hidden // self.num_heads

    def to_native(self):
        """The C++ GPTConfig with the same values."""
        c = _C.models.GPTConfig()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "device":
                value = torch.device(value)
            elif f.name == "moe":
                value = value.to_native()
            setattr(c, f.name, value)
        return c

    def validate(self, tp_size):
        """Raises torus.InvalidArgument (no communication)."""
        self.to_native().validate(tp_size)

    @staticmethod
    def tiny():
        return GPTConfig(vocab_size=61, max_seq_len=16, num_layers=2, hidden=32, num_heads=4)

    @staticmethod
    def small():
        return GPTConfig(vocab_size=8192, max_seq_len=128, num_layers=4, hidden=256, num_heads=8)

    @staticmethod
    def gpt2():
        return GPTConfig()


def _hidden_region(cfg):
    return P.RngRegion.SHARDED if cfg.sequence_parallel else P.RngRegion.REPLICATED


class GPTEmbedding(torch.nn.Module):
    def __init__(self, cfg, tp, rng):
        super().__init__()
        self.cfg, self.tp, self.rng = cfg, tp, rng
        self.word = P.VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden, tp, pad_multiple=cfg.vocab_pad_multiple,
            reduce_scatter_output=cfg.sequence_parallel, seed=P.derive_seed(cfg.seed, "embedding.word"),
            init_std=cfg.init_std, dtype=cfg.dtype, device=cfg.device)
        self.position = P._parameter([cfg.max_seq_len, cfg.hidden], -1, -1, 0, "normal", cfg.init_std,
                                     P.derive_seed(cfg.seed, "embedding.position"), None, cfg.dtype, cfg.device,
                                     partial=cfg.sequence_parallel)

    def forward(self, tokens):
        n = P.group_size(self.tp)
        seq = tokens.shape[1]
        self.cfg.to_native().validate_sequence(seq, n)
        x = self.word(tokens.t().contiguous())
        if self.cfg.sequence_parallel:
            pos = self.position.narrow(0, P.group_rank(self.tp) * (seq // n), seq // n)
        else:
            pos = self.position.narrow(0, 0, seq)
        x = x + pos.unsqueeze(1)
        return P.dropout(x, self.cfg.dropout, self.training, self.rng, _hidden_region(self.cfg))


class GPTBlock(torch.nn.Module):
    def __init__(self, cfg, layer, tp, rng):
        super().__init__()
        self.cfg, self.tp, self.rng = cfg, tp, rng
        sp, prefix = cfg.sequence_parallel, f"blocks.{layer}."
        out_std = cfg.init_std / math.sqrt(2.0 * cfg.num_layers)
        common = dict(dtype=cfg.dtype, device=cfg.device)
        self.local_heads = cfg.num_heads // P.group_size(tp)
        self.ln1 = P.LayerNorm(cfg.hidden, cfg.layernorm_eps, sequence_parallel=sp, **common)
        self.qkv = P.ColumnParallelLinear(cfg.hidden, 3 * cfg.hidden, tp, bias=False, sequence_parallel=sp,
                                          seed=P.derive_seed(cfg.seed, prefix + "qkv"), init_std=cfg.init_std, **common)
        # Queries and values only: softmax ignores a key bias (see Note [QKV layout] in gpt.h).
        self.qv_bias = P._parameter([cfg.num_heads, 2, cfg.head_dim], 0, -1, cfg.num_heads, "zeros", 0.0, 0, tp,
                                    cfg.dtype, cfg.device)
        self.proj = P.RowParallelLinear(cfg.hidden, cfg.hidden, tp, sequence_parallel=sp,
                                        seed=P.derive_seed(cfg.seed, prefix + "proj"), init_std=out_std, **common)
        self.ln2 = P.LayerNorm(cfg.hidden, cfg.layernorm_eps, sequence_parallel=sp, **common)
        self.fc1 = P.ColumnParallelLinear(cfg.hidden, cfg.ffn, tp, sequence_parallel=sp,
                                          seed=P.derive_seed(cfg.seed, prefix + "fc1"), init_std=cfg.init_std, **common)
        self.fc2 = P.RowParallelLinear(cfg.ffn, cfg.hidden, tp, sequence_parallel=sp,
                                       seed=P.derive_seed(cfg.seed, prefix + "fc2"), init_std=out_std, **common)

    def attention(self, x):
        qkv = self.qkv(x)  # [s, b, 3h/tp]; rows of the weight are [head][q|k|v][head_dim]
        s, b, hd = qkv.shape[0], qkv.shape[1], self.cfg.head_dim
        qkv = qkv.view(s, b, self.local_heads, 3, hd)
        q = (qkv.select(3, 0) + self.qv_bias.select(1, 0)).permute(1, 2, 0, 3)
        k = qkv.select(3, 1).permute(1, 2, 0, 3)
        v = (qkv.select(3, 2) + self.qv_bias.select(1, 1)).permute(1, 2, 0, 3)
        if self.cfg.attention_dropout == 0.0 or not self.training:
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
            causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu_(1)
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
            probs = P.dropout(probs, self.cfg.attention_dropout, True, self.rng, P.RngRegion.SHARDED)
            ctx = torch.matmul(probs, v)
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * hd)
        return self.proj(ctx)

    def forward(self, x):
        region, p = _hidden_region(self.cfg), self.cfg.dropout
        x = x + P.dropout(self.attention(self.ln1(x)), p, self.training, self.rng, region)
        m = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x + P.dropout(m, p, self.training, self.rng, region)


class GPTHead(torch.nn.Module):
    def __init__(self, cfg, tp, tied_embedding=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.ln_f = P.LayerNorm(cfg.hidden, cfg.layernorm_eps, sequence_parallel=cfg.sequence_parallel,
                                dtype=cfg.dtype, device=cfg.device)
        # A tied head reuses the embedding module's weight (not registered twice).
        self._tied = [tied_embedding] if tied_embedding is not None else None
        if tied_embedding is None:
            name = "embedding.word" if cfg.tie_embeddings else "head.output"
            padded = P.pad_vocab(cfg.vocab_size, P.group_size(tp), cfg.vocab_pad_multiple)
            self.output = P._parameter([cfg.vocab_size, cfg.hidden], 0, cfg.vocab_size, padded, "normal",
                                       cfg.init_std, P.derive_seed(P.derive_seed(cfg.seed, name), "weight"), tp,
                                       cfg.dtype, cfg.device)

    def output_weight(self):
        return self._tied[0].weight if self._tied else self.output

    def forward(self, x):
        return P._tp.column_parallel_linear(self.ln_f(x), self.output_weight(), None, self.tp, False,
                                            self.cfg.sequence_parallel)

    def loss(self, logits, labels):
        targets = labels.t()
        per_token = P.vocab_parallel_cross_entropy(logits, targets, self.tp, self.cfg.vocab_size)
        count = targets.ne(-100).sum().clamp_min(1).to(per_token.dtype)
        return per_token.sum() / count


class GPT(torch.nn.Module):
    """Pre-LayerNorm decoder; heads, MLP and vocabulary split over ``groups.tp``."""

    def __init__(self, cfg, groups=None):
        super().__init__()
        tp = groups.tp if groups is not None else None
        cfg.validate(P.group_size(tp))
        if cfg.moe_every > 0:
            raise NotImplementedError(
                "the Python GPT has no MoE blocks; train MoE models with torus.train.GPTTrainer (the C++ GPT)"
            )
        self.cfg, self.tp = cfg, tp
        self.padded_vocab = P.pad_vocab(cfg.vocab_size, P.group_size(tp), cfg.vocab_pad_multiple)
        self.rng = P.RngTracker(cfg.seed, P.group_rank(tp), torch.device(cfg.device))
        self.embedding = GPTEmbedding(cfg, tp, self.rng)
        self.blocks = torch.nn.ModuleDict({str(i): GPTBlock(cfg, i, tp, self.rng) for i in range(cfg.num_layers)})
        self.head = GPTHead(cfg, tp, self.embedding.word if cfg.tie_embeddings else None)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x)

    def loss(self, tokens, labels):
        return self.head.loss(self.forward(tokens), labels)
