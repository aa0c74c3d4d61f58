"""Hugging Face interop against the transformers package itself, one process.

* Export: a Llama (GQA, untied) and a GPT trained a few steps by TrainLoop,
  written by ``torus-ckpt export-hf``, load with ``from_pretrained``; the
  loss transformers computes on a batch equals Torus's ``evaluate`` on it,
  and its logits equal ``Trainer.logits`` position for position; in shards
  (``--max-shard-size``) with the tokenizer of the run's ``--init-from``
  directory, it loads the same way and the tokenizer loads too.
* A model whose head split or rotary embedding differs from the
  directory's is refused before loading (the shapes alone would not show it).
* Import: a randomly initialised ``LlamaForCausalLM`` / ``GPT2LMHeadModel``
  saved with ``save_pretrained`` starts a TrainLoop (``init_from=DIR``) whose
  ``evaluate`` equals the transformers loss and ``Trainer.logits`` its
  logits; the weights are not Torus's initial ones.
Tolerances are f32's (both sides compute in f32 with other kernels).
"""
import json
import pathlib
import subprocess

import pytest
import torch

import torus
from torus import train

# transformers is pinned in requirements.txt (scripts/setup.sh installs it): a
# missing package fails here, naming it, instead of skipping.
import transformers  # noqa: E402

BIN = pathlib.Path(torus.__file__).resolve().parents[2] / "bin"
COMMON = dict(seq=16, batch=4, micro_batches=1, warmup=1, eval_interval=0, eval_batches=1, tensorboard=False,
              progress="off", peak_tflops=1.0, threads=1)
RTOL = 2e-5
LOGITS_TOL = 1e-5  # f32 logits of O(1): both sides' kernels sum in other orders


@pytest.fixture(scope="module")
def world():
    return torus.init()


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (4, 17), generator=g)


def hf_logits(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens[:, :-1]).logits.float()


def assert_same_logits(trainer, model, tokens):
    """Torus's logits of every position equal transformers', tensor for tensor (f32)."""
    got = trainer.logits(tokens)
    want = hf_logits(model, tokens)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=LOGITS_TOL, atol=LOGITS_TOL)


def hf_loss(model, tokens):
    # Torus's evaluate reads tokens [:, :-1] and predicts [:, 1:]: the same here.
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                                 tokens[:, 1:].reshape(-1)).item()


@pytest.mark.parametrize("model,extra", [("llama-tiny", dict(tie_embeddings=False)), ("gpt", dict(layers=2))])
def test_export_loads_in_transformers_with_the_same_loss(world, tmp_path, model, extra):
    loop = train.TrainLoop(world, train.RunConfig(model=model, out=str(tmp_path / "run"), steps=3, save_every=3,
                                                  **COMMON, **extra))
    loop.run()
    ck = tmp_path / "run" / "checkpoints" / "step-00000003"
    out = tmp_path / "hf"
    r = subprocess.run([str(BIN / "torus-ckpt"), "export-hf", str(ck), str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == ("llama" if model.startswith("llama") else "gpt2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, use_kernels=False)
    tokens = batch(256, 11)
    want = hf_loss(hf, tokens)
    got = loop.trainer().evaluate(tokens)
    assert got == pytest.approx(want, rel=RTOL)
    assert_same_logits(loop.trainer(), hf, tokens)
    if model.startswith("llama"):
        assert hf.config.num_key_value_heads == 2 and not hf.config.tie_word_embeddings


def test_sharded_export_with_the_tokenizer_of_the_init_directory(world, tmp_path, monkeypatch):
    # A run started from a Hugging Face directory that has a tokenizer, named
    # by a relative path: its export, from another working directory and in
    # shards of at most 64 kB, loads with from_pretrained (index and all) to
    # the same logits, and the tokenizer (chat template included) comes
    # along. A run resumed from its checkpoint keeps naming that directory.
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    hf, d = hf_llama(tmp_path)
    tok = Tokenizer(tok_models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "torus": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(d))
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    monkeypatch.chdir(tmp_path)
    rel = str(d.relative_to(tmp_path))
    loop = train.TrainLoop(world, train.RunConfig(out="run", model=rel, init_from=rel, steps=2, save_every=2,
                                                  **COMMON))
    loop.run()
    out = tmp_path / "hf-out"
    r = subprocess.run([str(BIN / "torus-ckpt"), "export-hf", str(tmp_path / "run" / "checkpoints" / "step-00000002"),
                        str(out), "--max-shard-size", "64kB"], capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).stat().st_size <= 64_000 + 4096 for s in shards[:-1])
    assert not (out / "model.safetensors").exists()
    assert "tokenizer files from" in r.stdout
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, use_kernels=False)
    assert_same_logits(loop.trainer(), exported, batch(256, 15))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("hello torus world")["input_ids"] == [1, 3, 2]
    assert (out / "chat_template.jinja").read_text() == (d / "chat_template.jinja").read_text()

    resumed = train.TrainLoop(world, train.RunConfig(out="run", model=rel, resume="run/checkpoints/step-00000002",
                                                     steps=4, save_every=2, **COMMON))
    resumed.run()
    again = tmp_path / "hf-again"
    r = subprocess.run([str(BIN / "torus-ckpt"), "export-hf", str(tmp_path / "run" / "checkpoints" / "step-00000004"),
                        str(again)], capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert (again / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()


def test_bad_export_is_refused(tmp_path):
    r = subprocess.run([str(BIN / "torus-ckpt"), "export-hf", str(tmp_path / "missing"), str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "torus-ckpt:" in r.stderr


def hf_llama(tmp_path, **rope):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                                   mlp_bias=False, **rope)
    torch.manual_seed(5)
    m = transformers.LlamaForCausalLM(cfg)
    m.save_pretrained(str(tmp_path / "hf-llama"))
    return m, tmp_path / "hf-llama"


def hf_gpt2(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(6)
    m = transformers.GPT2LMHeadModel(cfg)
    m.save_pretrained(str(tmp_path / "hf-gpt2"))
    return m, tmp_path / "hf-gpt2"


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_init_from_a_transformers_directory(world, tmp_path, which):
    if which == "llama":
        hf, d = hf_llama(tmp_path)
        cfg = dict(model="llama-tiny", tie_embeddings=False)
    else:
        hf, d = hf_gpt2(tmp_path)
        cfg = dict(model="gpt", layers=2, hidden=32, heads=4, dropout=0.0)
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "run"), init_from=str(d), steps=1, **COMMON,
                                                  **cfg))
    tokens = batch(256, 12)
    assert loop.trainer().evaluate(tokens) == pytest.approx(hf_loss(hf, tokens), rel=RTOL)
    assert_same_logits(loop.trainer(), hf, tokens)
    # The weights are transformers' (not a Torus initialisation that happens to
    # give a near-uniform loss too).
    word = loop.trainer().gather_local_parameters()["embedding.word.weight"]
    assert torch.equal(word, hf.get_input_embeddings().weight.detach())


def test_init_from_refuses_another_rotary_or_head_split(world, tmp_path):
    hf, d = hf_llama(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    cfg = dict(model="llama-tiny", tie_embeddings=False, init_from=str(d), steps=1, **COMMON)
    with pytest.raises(torus.InvalidArgument, match="rope_theta 500000"):
        train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "a"), **cfg))
    with pytest.raises(torus.InvalidArgument, match="key/value heads"):
        train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "b"), rope_theta=500000.0, kv_heads=4, **cfg))
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "c"), rope_theta=500000.0, **cfg))
    tokens = batch(256, 13)
    assert loop.trainer().evaluate(tokens) == pytest.approx(hf_loss(hf, tokens), rel=RTOL)


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_model_shape_from_the_directory(world, tmp_path, which):
    # --model DIR: the shape (GQA and llama3 rotary scaling for the Llama)
    # comes from config.json alone; with --init-from DIR the losses are
    # transformers'.
    if which == "llama":
        hf, d = hf_llama(tmp_path, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 32})
    else:
        hf, d = hf_gpt2(tmp_path)
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "run"), model=str(d), init_from=str(d), steps=1,
                                                  **COMMON))
    tokens = batch(256, 14)
    assert loop.trainer().evaluate(tokens) == pytest.approx(hf_loss(hf, tokens), rel=RTOL)
    assert_same_logits(loop.trainer(), hf, tokens)
    # Every transformers parameter, less GPT-2's key biases (dropped exactly:
    # softmax does not see a per-query constant).
    dropped = 0 if which == "llama" else hf.config.n_layer * hf.config.n_embd
    assert loop.trainer().num_parameters() == sum(p.numel() for p in hf.parameters()) - dropped
    with pytest.raises(torus.InvalidArgument, match="config.json; drop --layers"):
        train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "b"), model=str(d), layers=3, steps=1, **COMMON))


def test_five_adamw_steps_equal_transformers_and_torch_optim(world, tmp_path):
    # The same GQA Llama (llama3 rotary scaling) trained 5 steps on the same
    # batches: by Torus from --model DIR --init-from DIR, and by transformers
    # with torch.optim.AdamW (decay on matrices and embeddings, as Torus);
    # constant learning rate, no clipping. Losses agree to f32 rounding.
    hf, d = hf_llama(tmp_path, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 32})
    rc = train.RunConfig(out=str(tmp_path / "run"), model=str(d), init_from=str(d), steps=5, optimizer="adamw",
                         lr=1e-3, min_lr=1e-3, weight_decay=0.1, grad_clip=0.0,
                         **dict(COMMON, warmup=0))
    loop = train.TrainLoop(world, rc)
    params = list(hf.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": rc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=rc.lr, betas=(rc.beta1, rc.beta2), eps=rc.eps, foreach=False)
    hf.train()
    for step in range(5):
        tokens = batch(256, 20 + step)
        logits = hf(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        got = loop.trainer().train_step(tokens, rc.lr).loss
        assert got == pytest.approx(loss.item(), rel=1e-5), step
    word = loop.trainer().gather_local_parameters()["embedding.word.weight"]
    torch.testing.assert_close(word, hf.get_input_embeddings().weight.detach(), rtol=1e-4, atol=1e-6)
