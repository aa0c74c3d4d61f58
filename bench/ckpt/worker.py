#!/usr/bin/env python3
"""One rank of the checkpoint benchmark (bench/ckpt/run.py starts it under mpirun; see its docstring).

Builds a GPTTrainer, takes one step (so that AdamW state exists), then runs
--repeats interleaved rounds of: file-system sequential write and read,
Torus sync save, Torus async save, Torus load, torch.save/torch.load and
torch.distributed.checkpoint save/load (gloo), each checked for equality with
the state saved. Every phase starts at a gloo barrier and is timed on every
rank; rank 0 writes every rank's times (and the bytes) as JSON to --out.
Exit 1 when a loaded state differs from the saved one.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

import torch
import torch.distributed as dist

BLOCK = 64 << 20  # the file-system probe's block


def now():
    return time.perf_counter()


def evict(paths):
    """Drops the files' pages from the page cache (posix_fadvise DONTNEED on clean, fsynced pages), so that a load
    reads the disk; returns the bytes still resident afterwards (fincore), -1 when unknown."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in names]
        elif os.path.exists(p):
            files.append(p)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not files or shutil.which("fincore") is None:
        return -1
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return -1
    return sum(int(x) for x in r.stdout.split() if x.isdigit())


def dir_bytes(path):
    total = 0
    for root, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    return total


def fs_write(path, nbytes, buf):
    """Sequential write of nbytes in BLOCK-sized writes from a preallocated buffer, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(buf)
        left = nbytes
        while left > 0:
            n = os.write(fd, view[:min(left, len(buf))])
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)


def fs_read(path, buf):
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        view = memoryview(buf)
        while True:
            n = os.readv(fd, [view])
            if n <= 0:
                break
            total += n
    finally:
        os.close(fd)
    return total


def same(a, b, what):
    """Exit 1 (with the first differing key) unless the two dicts of tensors are equal."""
    missing = sorted(set(a) ^ set(b))
    if missing:
        fail(f"{what}: keys differ: {missing[:5]}")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]):
            fail(f"{what}: '{k}' differs from the saved state")


def fail(msg):
    print(f"rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')}: verification failed: {msg}", file=sys.stderr,
          flush=True)
    os._exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gloo-store", required=True, help="a path that does not exist yet (gloo's FileStore)")
    ap.add_argument("--no-dcp-async", action="store_true")
    args = ap.parse_args()

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    import torus
    from torus import checkpoint, models, train

    world = torus.init()
    assert world.rank == rank and world.size == size, (world.rank, world.size, rank, size)
    # A file store, no port: MASTER_ADDR/MASTER_PORT are torus.init's (torchrun-style launches), and a port picked
    # by the driver could be taken by any other bind before rank 0 listens on it.
    dist.init_process_group("gloo", init_method=f"file://{args.gloo_store}", rank=rank, world_size=size)
    zero = 1 if size > 1 else 0
    cfg = models.GPTConfig(vocab_size=256, max_seq_len=args.seq, num_layers=args.layers, hidden=args.hidden,
                           num_heads=args.heads)
    trainer = train.GPTTrainer(world, cfg, train.ParallelLayout(dp=size, zero=zero), train.OptimizerConfig(lr=1e-3),
                               train.TrainerOptions())
    g = torch.Generator().manual_seed(7)
    batch = torch.randint(0, 256, (size, args.seq + 1), generator=g, dtype=torch.int64)
    trainer.train_step(batch)
    # state_dict() aliases the live tensors, but counters (engine.*, scaler.*) are fresh tensors on every call:
    # it is called again wherever the current state is needed.
    live = trainer.state_dict()
    ref = {k: v.clone() for k, v in live.items()}
    work = os.path.join(args.dir, "work")
    ckdir = os.path.join(work, "torus")
    if rank == 0:
        os.makedirs(ckdir, exist_ok=True)
    dist.barrier()

    times = {}  # phase -> [seconds per repeat]
    extra = {}  # phase -> [what else per repeat]

    def timed(phase, fn):
        dist.barrier()
        t0 = now()
        r = fn()
        times.setdefault(phase, []).append(now() - t0)
        return r

    def perturb():
        with torch.no_grad():
            for v in trainer.state_dict().values():
                v.zero_()

    def rank0_rm(path):
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()

    sync_ck = checkpoint.Checkpointer(world, trainer, ckdir, keep_last=0)
    async_ck = checkpoint.Checkpointer(world, trainer, ckdir, keep_last=0, async_save=True)

    # Warm-up: one Torus save, which also says which tensors and how many bytes this rank writes.
    step = 1
    sync_ck.save(step)
    path = sync_ck.last_path if rank == 0 else None
    path = bcast(path)
    verified_step = checkpoint.verify(path) if rank == 0 else step
    with open(os.path.join(path, f"rank-{rank:05d}.done.json")) as f:
        done = json.load(f)
    mine = sorted(done["slices"])  # the tensors this rank writes (each piece once over the job)
    absent = [k for k in mine if k not in live]
    if absent:
        fail(f"the rank file holds tensors that state_dict() lacks: {absent[:5]}")
    rank_file_bytes = done["bytes"]
    state_bytes = sum(live[k].numel() * live[k].element_size() for k in mine)
    ckpt_bytes = dir_bytes(path)
    rank0_rm(path)

    fsbuf = bytearray(os.urandom(BLOCK))
    fs_path = os.path.join(work, f"fs_rank{rank}.bin")
    torch_path = os.path.join(work, f"torch_rank{rank}.pt")
    dcp_dir = os.path.join(work, "dcp")
    import torch.distributed.checkpoint as dcp
    have_dcp_async = hasattr(dcp, "async_save") and not args.no_dcp_async
    notes = {}
    resident = {}
    bytes_of = {"fs": 0, "torus_sync": 0, "torus_async": 0, "torch": 0, "dcp": 0, "dcp_async": 0}

    for rep in range(args.repeats):
        # The state every load of this round must reproduce (the asynchronous phase at the end takes a step).
        if rep > 0:
            ref = {k: v.clone() for k, v in trainer.state_dict().items()}

        # File system: the bytes of this rank's Torus file, all ranks at once.
        timed("fs_write", lambda: fs_write(fs_path, rank_file_bytes, fsbuf))
        resident.setdefault("fs_read", []).append(evict([fs_path]))
        n = timed("fs_read", lambda: fs_read(fs_path, fsbuf))
        if n != rank_file_bytes:
            fail(f"read {n} bytes of {fs_path}, wrote {rank_file_bytes}")
        bytes_of["fs"] = os.path.getsize(fs_path)
        os.remove(fs_path)

        # Torus, synchronous.
        step += 1
        timed("torus_sync", lambda: sync_ck.save(step))
        extra.setdefault("torus_sync_last_save_s", []).append(sync_ck.last_save_s)
        sync_path = os.path.join(ckdir, f"step-{step:08d}")
        bytes_of["torus_sync"] = dir_bytes(sync_path) if rank == 0 else 0  # the whole checkpoint, once

        # Torus load (of the sync checkpoint), from the disk, into a zeroed state.
        perturb()
        resident.setdefault("torus_load", []).append(evict([sync_path]))
        rep_info = timed("torus_load", lambda: checkpoint.resume(world, trainer, sync_path))
        if rep_info["step"] != step or rep_info["kept"]:
            fail(f"resume of {sync_path}: step {rep_info['step']} (saved {step}), kept {rep_info['kept']}")
        same(trainer.state_dict(), ref, f"torus load of {sync_path}")
        rank0_rm(sync_path)

        # torch.save / torch.load of the same tensors, fsynced like Torus's files.
        live = trainer.state_dict()
        # A view (a parameter inside a gradient-sync bucket) is given to torch.save as its own tensor: torch.save
        # writes a view's whole storage, which would make it write other ranks' bytes too.
        state = {k: (live[k] if live[k].untyped_storage().nbytes() == live[k].numel() * live[k].element_size()
                     else live[k].clone()) for k in mine}

        def tsave():
            with open(torch_path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        timed("torch_save", tsave)
        bytes_of["torch"] = os.path.getsize(torch_path)
        resident.setdefault("torch_load", []).append(evict([torch_path]))
        loaded = timed("torch_load", lambda: torch.load(torch_path, weights_only=True))
        same(loaded, {k: ref[k] for k in mine}, "torch.load")
        del loaded
        os.remove(torch_path)

        # torch.distributed.checkpoint on gloo (its FileSystemWriter fsyncs: sync_files=True).
        dstate = {f"r{rank}.{k}": live[k] for k in mine}
        timed("dcp_save", lambda: dcp.save(dstate, checkpoint_id=dcp_dir))
        dist.barrier()
        bytes_of["dcp"] = dir_bytes(dcp_dir) if rank == 0 else 0
        resident.setdefault("dcp_load", []).append(evict([dcp_dir]) if rank == 0 else 0)
        dest = {k: torch.empty_like(v) for k, v in dstate.items()}
        timed("dcp_load", lambda: dcp.load(dest, checkpoint_id=dcp_dir))
        same({k.split(".", 1)[1]: v for k, v in dest.items()}, {k: ref[k] for k in mine}, "dcp.load")
        del dest
        rank0_rm(dcp_dir)
        if have_dcp_async:
            try:
                dist.barrier()
                t0 = now()
                fut = dcp.async_save(dstate, checkpoint_id=dcp_dir)
                stall = now() - t0
                fut.result()
                total = now() - t0
                times.setdefault("dcp_async_stall", []).append(stall)
                times.setdefault("dcp_async", []).append(total)
                dist.barrier()
                bytes_of["dcp_async"] = dir_bytes(dcp_dir) if rank == 0 else 0
            except Exception as e:  # noqa: BLE001  (an optional peer)
                have_dcp_async = False
                notes["dcp_async"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            rank0_rm(dcp_dir)

        # Torus, asynchronous, as a training loop uses it: save() copies the small tensors and returns; the
        # parameters and optimizer state are copied in the background while the next step's forward and backward
        # run, and that step's update waits for the copy. The training stall is save() plus what the next step
        # took beyond a step without a save (measured just before); the total runs until wait() returns.
        base = timed("step_plain", lambda: trainer.train_step(batch))
        del base
        ref_async = {k: v.clone() for k, v in trainer.state_dict().items()}  # what the checkpoint must hold
        step += 1
        dist.barrier()
        t0 = now()
        async_ck.save(step)
        t_ret = now() - t0
        trainer.train_step(batch)
        t_step = now() - t0 - t_ret
        async_ck.wait()
        total = now() - t0
        times.setdefault("torus_async_return", []).append(t_ret)
        times.setdefault("step_during_async", []).append(t_step)
        times.setdefault("torus_async_stall", []).append(t_ret + max(0.0, t_step - times["step_plain"][-1]))
        times.setdefault("torus_async", []).append(total)
        times.setdefault("torus_async_reported", []).append(async_ck.last_stall_s)  # save() + the update's wait
        extra.setdefault("torus_async_last_save_s", []).append(async_ck.last_save_s)
        apath = os.path.join(ckdir, f"step-{step:08d}")
        bytes_of["torus_async"] = dir_bytes(apath) if rank == 0 else 0
        if rank == 0 and rep == 0:
            checkpoint.verify(apath)
        # The checkpoint holds the state of save() time, not the update that ran meanwhile: loading it takes the
        # trainer back there (untimed).
        info = checkpoint.resume(world, trainer, apath)
        if info["step"] != step or info["kept"]:
            fail(f"resume of {apath}: step {info['step']} (saved {step}), kept {info['kept']}")
        same(trainer.state_dict(), ref_async, f"torus async checkpoint {apath} (a torn snapshot?)")
        del ref_async
        rank0_rm(apath)

    mine_out = dict(rank=rank, times=times, extra=extra, resident=resident, bytes=bytes_of,
                    rank_file_bytes=rank_file_bytes, state_bytes=state_bytes, notes=notes,
                    state_keys=len(mine), rss_peak=train.peak_rss_bytes())
    gathered = [None] * size
    dist.all_gather_object(gathered, mine_out)
    if rank == 0:
        doc = dict(ranks=size, zero_stage=zero, parameters=trainer.num_parameters(), ckpt_bytes=ckpt_bytes,
                   verified_step=verified_step, torch=torch.__version__, per_rank=gathered,
                   config=dict(hidden=args.hidden, layers=args.layers, heads=args.heads, seq=args.seq,
                               vocab=256, repeats=args.repeats, threads=args.threads))
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    dist.barrier()
    del sync_ck, async_ck
    dist.destroy_process_group()
    return 0


def bcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


if __name__ == "__main__":
    try:
        rc = main()
    except BaseException:  # noqa: BLE001
        # Out at once: a normal interpreter exit would finalize MPI and wait for peers that wait for this rank.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(rc)
