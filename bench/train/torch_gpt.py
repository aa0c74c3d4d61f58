"""torch_gpt.py — the benchmark's GPT written in plain torch.nn, as a user of
torch DistributedDataParallel would write it: the architecture of
torus.models.GPT (pre-LayerNorm blocks, per-head query/value biases, causal
scaled-dot-product attention, tanh-GELU MLP, tied output layer), batch-first,
on stock modules (nn.Embedding, nn.Linear, nn.LayerNorm, F.cross_entropy).

TorchGPT.from_torus(model) copies the weights of a torus.models.GPT (no tensor
parallelism), so both compute the same loss on the same batch; the training
benchmark checks that at step 0.
"""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, eps):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.qv_bias = nn.Parameter(torch.zeros(heads, 2, self.head_dim))
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads, 3, self.head_dim)
        q = (qkv[:, :, :, 0] + self.qv_bias[:, 0]).transpose(1, 2)
        k = qkv[:, :, :, 1].transpose(1, 2)
        v = (qkv[:, :, :, 2] + self.qv_bias[:, 1]).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(ctx.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    def __init__(self, vocab, max_seq, layers, hidden, heads, ffn=0, eps=1e-5):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.zeros(max_seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn or 4 * hidden, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=eps)

    def forward(self, tokens):
        """Logits [batch, seq, vocab] of tokens [batch, seq] (int64)."""
        x = self.word(tokens) + self.position[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.word.weight)  # tied output layer

    @staticmethod
    def loss(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    @classmethod
    def from_torus(cls, model, cfg):
        """A TorchGPT holding the weights of `model` (a torus.models.GPT of config `cfg`, TP=1, tied)."""
        src = dict(model.named_parameters())
        if "head.output" in src or cfg.vocab_pad_multiple != 1:
            raise ValueError("TorchGPT.from_torus: needs a tied, unpadded torus.models.GPT")
        out = cls(cfg.vocab_size, cfg.max_seq_len, cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.ffn_hidden,
                  cfg.layernorm_eps)
        names = {"word.weight": "embedding.word.weight", "position": "embedding.position",
                 "ln_f.weight": "head.ln_f.weight", "ln_f.bias": "head.ln_f.bias"}
        with torch.no_grad():
            for name, p in out.named_parameters():
                p.copy_(src[names.get(name, name)])
        return out
