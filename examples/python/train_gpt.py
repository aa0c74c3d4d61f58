#!/usr/bin/env python3
"""train_gpt.py — torus-train from Python: trains a byte-level GPT language
model with tensor (--tp), pipeline (--pp) and data (--dp) parallelism.
Launch one process per rank:

    mpirun -np 8 python3 examples/python/train_gpt.py --tp 2 --pp 2 --dp 2 --steps 200
    python3 examples/python/train_gpt.py --help

There is one option table and one loop, both in the C++ core: the flags (and
--config files) are parsed by ``torus.train.RunConfig`` — the table of
torus-train — and the run is ``torus.train.TrainLoop``, the loop of
torus-train, so the two front ends print the same step lines and write the
same metrics records. From Python code the same options are keyword
arguments::

    cfg = torus.train.RunConfig(tp=2, pp=2, precision="bf16", steps=200)
    torus.train.TrainLoop(torus.init(), cfg).run()

At the end the logging rank draws <out>/loss.png with ``torus.plot``. Run
from a build tree with PYTHONPATH=<build>/python.
"""

import sys

import torus
from torus import plot, train

PROG = "train_gpt.py"
DESCRIPTION = ("Trains a byte-level GPT language model with tensor (--tp), pipeline (--pp) and data (--dp) "
               "parallelism.\nLaunch one process per rank, e.g.: "
               "mpirun -np 8 python3 examples/python/train_gpt.py --tp 2 --pp 2 --dp 2")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = train.RunConfig.from_args(argv)
        if cfg is None:
            print(train.run_config_help(PROG, DESCRIPTION))
            return 0
        cfg.validate()  # before any communication
        torus.retain_freed_host_memory()
        world = torus.init()
        loop = train.TrainLoop(world, cfg, PROG)
        loop.run()
        if loop.trainer().is_logging_rank():
            print(f"plot: {plot.plot_run(cfg.out)}", flush=True)
        return 0
    except torus.InvalidArgument as e:
        print(f"{PROG}: error: {e}\n(see {PROG} --help)", file=sys.stderr)
        return 2
    except torus.Error as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
