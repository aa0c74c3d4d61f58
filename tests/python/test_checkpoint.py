"""torus.checkpoint and torus-ckpt, one process.

* A GPTTrainer's checkpoint resumes into a fresh trainer with every state
  tensor equal (torch.equal) and the next losses equal.
* ``export`` writes one safetensors file that the ``safetensors`` package
  reads back with the trainer's full parameters, and ``--init-from`` style
  loading of it (``TrainLoop(RunConfig(init_from=...))``) starts from them.
* ``torus-ckpt`` lists, verifies (exit 0) and, after a flipped byte, refuses
  (exit 1, naming the file); ``torus.checkpoint.verify`` raises
  ``torus.CheckpointError``.
* ``TrainLoop`` with ``RunConfig(save_every=..., resume=...)`` from Python.
"""
import json
import pathlib
import subprocess

import pytest
import safetensors.torch as safetensors_torch
import torch

import torus
from torus import checkpoint, models, train


BIN = pathlib.Path(torus.__file__).resolve().parents[2] / "bin"
CFG = models.GPTConfig(vocab_size=256, max_seq_len=16, num_layers=2, hidden=32, num_heads=2)


def batches(n):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (8, 17), generator=g) for _ in range(n)]


def make_trainer(world):
    return train.GPTTrainer(world, CFG, train.ParallelLayout(num_micro=2), train.OptimizerConfig(lr=3e-3))


@pytest.fixture(scope="module")
def world():
    return torus.init()


def test_resume_restores_every_tensor_and_the_next_losses(world, tmp_path):
    bs = batches(6)
    t = make_trainer(world)
    for b in bs[:3]:
        t.train_step(b)
    ck = checkpoint.Checkpointer(world, t, str(tmp_path), keep_last=1)
    ck.save(t.steps_taken())
    saved = {k: v.clone() for k, v in t.state_dict().items()}
    fresh = make_trainer(world)
    info = checkpoint.resume(world, fresh, "auto", str(tmp_path))
    assert info["step"] == 3 and info["same_layout"] and info["path"].endswith("step-00000003")
    now = fresh.state_dict()
    assert set(now) == set(saved)
    for k, v in saved.items():
        assert torch.equal(now[k], v), k
    assert [t.train_step(b).loss for b in bs[3:]] == [fresh.train_step(b).loss for b in bs[3:]]


def test_export_reads_in_safetensors_and_cli_verifies(world, tmp_path):
    t = make_trainer(world)
    t.train_step(batches(1)[0])
    checkpoint.Checkpointer(world, t, str(tmp_path / "ck")).save(1)
    path = str(tmp_path / "ck" / "step-00000001")
    assert checkpoint.verify(path) == 1
    out = tmp_path / "model.safetensors"
    n = checkpoint.export(path, str(out))
    loaded = safetensors_torch.load_file(str(out))
    params = t.gather_local_parameters()
    assert n == len(loaded) and set(loaded) == set(params)
    for k, v in params.items():
        assert torch.equal(loaded[k], v), k

    cli = str(BIN / "torus-ckpt")
    r = subprocess.run([cli, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "verify" in r.stdout
    r = subprocess.run([cli, "list", str(tmp_path / "ck")], capture_output=True, text=True)
    assert r.returncode == 0 and "complete" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([cli, "verify", path], capture_output=True, text=True)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([cli, "export", path, str(tmp_path / "again.safetensors")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    again = safetensors_torch.load_file(str(tmp_path / "again.safetensors"))
    assert all(torch.equal(again[k], loaded[k]) for k in loaded)

    rank_file = pathlib.Path(path) / "rank-00000.safetensors"
    data = bytearray(rank_file.read_bytes())
    data[-5] ^= 0x01
    rank_file.write_bytes(bytes(data))
    r = subprocess.run([cli, "verify", path], capture_output=True, text=True)
    assert r.returncode == 1 and "BAD" in r.stdout and "rank-00000.safetensors" in r.stdout, r.stdout
    with pytest.raises(torus.CheckpointError, match="rank-00000.safetensors"):
        checkpoint.verify(path)


def test_train_loop_saves_resumes_and_inits_from_python(world, tmp_path):
    common = dict(layers=2, hidden=32, heads=2, seq=16, batch=8, micro_batches=2, steps=4, warmup=1,
                  eval_interval=0, eval_batches=1, tensorboard=False, progress="off", peak_tflops=1.0, threads=1)
    ref_losses, resumed = [], []
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "a"), save_every=2, **common))
    loop.on_step(lambda r: ref_losses.append(r.loss))
    loop.run()
    ckdir = tmp_path / "a" / "checkpoints"
    assert [c["step"] for c in checkpoint.list(str(ckdir)) if c["complete"]] == [2, 4]
    manifest = json.loads((ckdir / "step-00000002" / "manifest.json").read_text())
    assert manifest["step"] == 2 and manifest["layout"]["tp"] == 1 and manifest["data"]["position"] == 2
    assert len(manifest["data"]["sha256"]) == 64

    again = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "b"), resume=str(ckdir / "step-00000002"),
                                                   **common))
    again.on_step(lambda r: resumed.append(r.loss))
    again.run()
    assert resumed == ref_losses[2:]

    exported = tmp_path / "w.safetensors"
    checkpoint.export(str(ckdir / "step-00000004"), str(exported))
    init = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "c"), init_from=str(exported), **common))
    weights = safetensors_torch.load_file(str(exported))
    for k, v in init.trainer().gather_local_parameters().items():
        assert torch.equal(v, weights[k]), k


def write_tok(path, vocab, docs):
    from torus.data.prepare import TokWriter
    w = TokWriter(str(path), vocab)
    for d in docs:
        w.add_document(d)
    w.finish()


def test_train_loop_on_token_data(world, tmp_path):
    # A Llama on a tokenized dataset (a .tok file of the preparation tool)
    # whose ids pass the byte range: documents of a repeating 12-token
    # pattern over ids 250..299, which a model learns within a few steps.
    pattern = [250 + (7 * i) % 50 for i in range(12)]
    tok = tmp_path / "pattern.tok"
    write_tok(tok, 300, [pattern * 40 for _ in range(8)])
    common = dict(model="llama-tiny", vocab=300, data=str(tok), seq=16, batch=8, micro_batches=2, steps=30,
                  warmup=2, lr=1e-2, eval_interval=0, eval_batches=1, tensorboard=False, progress="off",
                  peak_tflops=1.0, threads=1)
    losses = []
    loop = train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "a"), save_every=30, **common))
    loop.on_step(lambda r: losses.append(r.loss))
    loop.run()
    assert abs(losses[0] - torch.log(torch.tensor(300.0)).item()) < 1.0, losses[0]  # near uniform at the start
    assert losses[-1] < losses[0] - 2.0, losses
    manifest = json.loads((tmp_path / "a" / "checkpoints" / "step-00000030" / "manifest.json").read_text())
    assert manifest["data"]["kind"] == "tokens" and manifest["data"]["tokens"] == 8 * 40 * 12
    assert manifest["data"]["vocab_size"] == 300 and manifest["model"]["family"] == "llama"
    # Where the sampler stands: 30 steps of 8 rows, in epochs of samples_per_epoch windows.
    pos = manifest["data"]
    assert pos["samples_consumed"] == 30 * 8 and pos["samples_per_epoch"] > 0
    assert pos["epoch"] == 240 // pos["samples_per_epoch"] and pos["sample_in_epoch"] == 240 % pos["samples_per_epoch"]
    config = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()][0]
    assert config["data"]["kind"] == "tokens" and config["data"]["source"] == str(tok)

    # A model whose embedding cannot hold the ids is refused, naming the fix.
    with pytest.raises(torus.InvalidArgument, match="--vocab 300"):
        train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "b"), **dict(common, vocab=0)))
    # Resuming on other token data is refused, naming both.
    other = tmp_path / "other.tok"
    write_tok(other, 300, [pattern * 41 for _ in range(8)])
    with pytest.raises(torus.InvalidArgument, match="other data"):
        train.TrainLoop(world, train.RunConfig(out=str(tmp_path / "c"), resume=str(tmp_path / "a" / "checkpoints" / "step-00000030"),
                                               **dict(common, data=str(other))))
