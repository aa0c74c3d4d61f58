"""Sharded, atomic, verified checkpoints (docs/checkpoint.md).

The C++ checkpoint layer, bound: every rank writes its own slices as
safetensors files, rank 0 writes the JSON manifest and the COMPLETE marker
last; a checkpoint loads into any other parallel layout. ``torus-train``
uses it through ``--save-every``/``--resume``; from Python::

    import torus
    from torus import checkpoint, train

    ck = checkpoint.Checkpointer(world, trainer, "runs/x/checkpoints", keep_last=2, async_save=True)
    ck.save(trainer.steps_taken())       # collective; async: returns after the host snapshot
    ck.wait()                            # the background write finished, on every rank

    info = checkpoint.resume(world, trainer, "auto", "runs/x/checkpoints")   # any layout
    checkpoint.verify("runs/x/checkpoints/step-00000100")                    # every SHA-256
    checkpoint.export("runs/x/checkpoints/step-00000100", "model.safetensors")

A ``TrainLoop`` does all of this from ``RunConfig(save_every=..., resume=...)``.
Errors raise ``torus.CheckpointError`` naming the file.
"""

from ._C.checkpoint import Checkpointer, export, list, resume, verify  # noqa: F401

__all__ = ["Checkpointer", "export", "list", "resume", "verify"]
