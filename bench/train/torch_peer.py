#!/usr/bin/env python3
"""torch_peer.py — the Python side of the training benchmark, one rank of an
mpirun job: the same GPT (torus.models.GPT, no tensor parallelism, so its
forward is plain ATen on this rank), batch, data and optimizer
(torch.optim.AdamW) as torus-bench-train, with the gradients synchronised by

  --impl torch-ddp        torch.nn.parallel.DistributedDataParallel on gloo
  --impl torch-ddp-view   the same with gradient_as_bucket_view=True
  --impl torus-dp         torus.parallel.DistributedDataParallel (torus::dp)
  --impl nosync           no gradient sync at all: the limit of the three above
                          (the replicas drift apart; only the losses are checked)

so that the data-parallel machinery is the only difference between rows.
With --model torch the rank trains TorchGPT instead (torch_gpt.py): the same
architecture and initial weights written in plain torch.nn, what a user of
torch DDP would run; rank 0 checks that its step-0 loss equals that of
torus.models.GPT on the same batch.
Prints one JSON record (rank 0) in the format of torus-bench-train and
verifies like it: finite losses and identical replicas after the last step.

    mpirun -np 2 python3 bench/train/torch_peer.py --impl torch-ddp --port 29533
"""
import argparse
import json
import os
import sys
import time

import torch


def batch_tokens(args, step):
    g = torch.Generator().manual_seed(100 + step)
    d = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    for i in range(1, d.shape[1]):
        d[:, i] = (d[:, i - 1] * 3 + 7) % args.vocab
    return d


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["torch-ddp", "torch-ddp-view", "torus-dp", "nosync"], required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--optimizer", choices=["default", "fused"], default="default",
                   help="torch.optim.AdamW as constructed by default, or with fused=True")
    p.add_argument("--model", choices=["torus", "torch"], default="torus",
                   help="torus.models.GPT, or the same GPT in plain torch.nn (torch_gpt.TorchGPT)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import torus
    from torus import models
    from torus import parallel as P

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    cfg = models.GPTConfig.small()
    cfg.num_layers, cfg.hidden, cfg.num_heads = args.layers, args.hidden, args.heads
    cfg.max_seq_len, cfg.vocab_size = args.seq, args.vocab
    model = models.GPT(cfg)
    loss_fn = model.head.loss
    loss0_ref = None
    if args.model == "torch":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_gpt import TorchGPT
        torus_model = model
        model = TorchGPT.from_torus(torus_model, cfg)
        loss_fn = TorchGPT.loss
        if rank == 0:  # the loss torus.models.GPT gives on the global batch of step 0
            d0 = batch_tokens(args, 0)
            with torch.no_grad():
                loss0_ref = torus_model.head.loss(torus_model(d0[:, :-1].contiguous()), d0[:, 1:].contiguous()).item()
        del torus_model

    if args.impl.startswith("torch-ddp"):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.impl == "torch-ddp-view")

        def zero_grad():
            opt.zero_grad(set_to_none=args.impl != "torch-ddp-view")

        def all_reduce(t, op):
            dist.all_reduce(t, op={"avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                   "min": dist.ReduceOp.MIN}[op])
            if op == "avg":
                t /= world
    else:
        tw = torus.init()
        if args.impl == "torus-dp":
            mesh = torus.DeviceMesh(tw, [("dp", world)])
            groups = P.ParallelGroups.from_mesh(mesh)
            ddp = P.DistributedDataParallel(model, groups, bucket_cap_mb=args.bucket_mb)

            def zero_grad():
                ddp.zero_grad()
        else:
            ddp = model

            def zero_grad():
                opt.zero_grad(set_to_none=False)

        def all_reduce(t, op):
            tw.all_reduce(t, op=op).wait()

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                            **({"fused": True} if args.optimizer == "fused" else {}))
    losses, step_s = [], []
    t0 = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            all_reduce(torch.zeros(1), "max")  # a barrier
            t0 = time.perf_counter()
        s0 = time.perf_counter()
        d = batch_tokens(args, step).chunk(world, 0)[rank]
        # Forward through the wrapper (torch DDP prepares its reducer there), loss on the logits.
        loss = loss_fn(ddp(d[:, :-1].contiguous()), d[:, 1:].contiguous())
        loss.backward()
        opt.step()
        zero_grad()
        step_s.append(time.perf_counter() - s0)
        losses.append(loss.item())
    all_reduce(torch.zeros(1), "max")
    wall = time.perf_counter() - t0

    l = torch.tensor(losses, dtype=torch.float64)
    all_reduce(l, "avg")
    sums = torch.stack([q.detach().double().sum() for q in model.parameters()])
    hi, lo = sums.clone(), sums.clone()
    all_reduce(hi, "max")
    all_reduce(lo, "min")
    replica_diff = (hi - lo).abs().max().item() if args.impl != "nosync" else 0.0  # no-sync replicas drift
    verified = bool(torch.isfinite(l).all()) and replica_diff <= 1e-6
    loss0_rel_diff = None
    if loss0_ref is not None:  # the mean over ranks of the step-0 loss is the loss of the global batch
        loss0_rel_diff = abs(l[0].item() - loss0_ref) / abs(loss0_ref)
        verified = verified and loss0_rel_diff <= 1e-4
    measured = sorted(step_s[args.warmup:])
    record = {
        "impl": args.impl, "model": args.model, "mode": "dp", "ranks": world, "threads": args.threads, "dp": world, "tp": 1,
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq": args.seq, "vocab": args.vocab,
        "global_batch": args.batch, "params": sum(q.numel() for q in model.parameters()), "steps": args.steps,
        "warmup": args.warmup, "wall_s": wall, "step_ms_mean": 1e3 * wall / args.steps,
        "step_ms_median": 1e3 * measured[len(measured) // 2],
        "tokens_per_s": args.batch * args.seq * args.steps / wall, "loss_first": l[0].item(),
        "loss_last": l[-1].item(), "replica_diff": replica_diff, "loss0_rel_diff": loss0_rel_diff,
        "verified": verified,
    }
    if rank == 0:
        print(json.dumps(record), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.write(json.dumps(record) + "\n")
    status = 0 if verified else 1
    if args.impl.startswith("torch-ddp"):
        torch.distributed.destroy_process_group()
        # Leave without the interpreter's teardown: with gloo, torch sometimes
        # aborts there ("terminate called without an active exception") after
        # the run has finished and reported; that is not what is measured.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
