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
