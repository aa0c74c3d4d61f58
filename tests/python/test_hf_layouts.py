"""Hugging Face weights in tp2 x pp2 against transformers, on 4 ranks.

Every rank builds the same randomly initialised transformers model (same
seed) and saves it to its own directory; a TrainLoop with --model DIR
--init-from DIR in tp2 x pp2 (1F1B, 2 micro-batches) reads each rank's
slices from it. Its evaluation, its logits (tensor for tensor, 1e-5) and
3 AdamW steps equal transformers with
torch.optim.AdamW in one process, to f32 rounding (the sums run in another
order across tp and micro-batches).
"""
import pytest
import torch

import torus
from torus import train

import transformers  # noqa: E402  (pinned in requirements.txt)

COMMON = dict(seq=16, batch=4, micro_batches=2, tp=2, pp=2, warmup=0, eval_interval=0, eval_batches=1,
              tensorboard=False, progress="off", peak_tflops=1.0, threads=1, optimizer="adamw", lr=1e-3,
              min_lr=1e-3, weight_decay=0.1, grad_clip=0.0, steps=3)


@pytest.fixture(scope="module")
def world():
    w = torus.init()
    assert w.size == 4, "registered on 4 ranks (tp2 x pp2)"
    return w


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (4, 17), generator=g)


def make(which, d):
    torch.manual_seed(7)
    if which == "llama":
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                                       rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 32})
        m = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        m = transformers.GPT2LMHeadModel(cfg)
    m.save_pretrained(str(d))
    return m


def loss_of(model, tokens):
    logits = model(input_ids=tokens[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_tp2_pp2_from_transformers_weights(world, tmp_path, which):
    hf = make(which, tmp_path / "hf")
    d = str(tmp_path / "hf")
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "run"), model=d, init_from=d, **COMMON))
    t = loop.trainer()
    tokens = batch(256, 30)
    hf.eval()
    with torch.no_grad():
        want = loss_of(hf, tokens).item()
    assert t.evaluate(tokens) == pytest.approx(want, rel=2e-5)
    # The logits of every position, gathered over tp and the pipeline, tensor for tensor.
    with torch.no_grad():
        want_logits = hf(input_ids=tokens[:, :-1]).logits
    got_logits = t.logits(tokens)
    assert got_logits.shape == want_logits.shape
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)

    params = list(hf.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=train.RunConfig().eps, foreach=False)
    hf.train()
    for step in range(3):
        tokens = batch(256, 40 + step)
        loss = loss_of(hf, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert t.train_step(tokens, 1e-3).loss == pytest.approx(loss.item(), rel=1e-5), step
