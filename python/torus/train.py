"""The 3D GPT trainer and the utilities of a training run.

``GPTTrainer`` trains the reference GPT (``torus.models``) with tensor,
sequence, pipeline and data parallelism cut from one mesh (pp x dp x tp, tp
innermost); it is the engine of ``torus-train`` and of
``examples/python/train_gpt.py``::

    import torus
    from torus import models, train

    world = torus.init()
    cfg = models.GPTConfig(vocab_size=256, max_seq_len=64, num_layers=4, hidden=128, num_heads=4)
    layout = train.ParallelLayout(tp=2, pp=2, dp=2, schedule="1f1b", num_micro=4)
    trainer = train.GPTTrainer(world, cfg, layout, train.OptimizerConfig(lr=3e-3))
    corpus = train.Corpus.load(train.default_corpus_path()).split(0.1)
    sampler = train.BatchSampler(corpus.train, seq_len=64, batch=16, seed=1234)
    lr = train.LrSchedule(peak=3e-3, min=3e-4, warmup_steps=20, total_steps=200)
    for step in range(200):
        stats = trainer.train_step(sampler.batch(step), lr(step))   # same batch on every rank
        if trainer.is_logging_rank():
            print(train.format_step_line(stats.step, loss=stats.loss, grad_norm=stats.grad_norm, lr=lr(step)))

``train_step(batch, lr=-1)`` takes ``[global_batch, seq + 1]`` int64 tokens —
the same tensor on every rank — and returns the same ``StepStats`` everywhere
(loss, grad_norm, clip_coefficient, skipped, timings, tokens, peak_live).
``evaluate(batch)`` is a forward-only pass. Both are collective and release
the GIL. Layout and size problems raise ``torus.InvalidArgument`` before any
communication; a failed peer raises ``torus.CommError``/``torus.TimeoutError``
and leaves the trainer unusable.

``gather_local_parameters()`` returns copies of the full (TP-gathered)
parameters this rank holds by single-process name (the last stage's copy of a
tied embedding is ``"head.output"``).

The utilities are the C++ ones of ``torus-train``: ``LrSchedule`` (linear
warm-up, cosine decay), ``Corpus`` / ``BatchSampler`` (byte corpus with a
held-out end, deterministic batches identical on every rank),
``format_step_line`` / ``format_bytes`` / ``render_progress`` /
``peak_rss_bytes`` (what a run reports) and ``write_line_plot_png`` (a PNG
plot with no dependencies).
"""

from . import _C

_train = _C.train

ParallelLayout = _train.ParallelLayout
OptimizerConfig = _train.OptimizerConfig
TrainerOptions = _train.TrainerOptions
StepStats = _train.StepStats
GPTTrainer = _train.GPTTrainer

LrSchedule = _train.LrSchedule
Corpus = _train.Corpus
CorpusSplit = _train.CorpusSplit
BatchSampler = _train.BatchSampler
default_corpus_path = _train.default_corpus_path

format_step_line = _train.format_step_line
format_bytes = _train.format_bytes
format_duration = _train.format_duration
render_progress = _train.render_progress
peak_rss_bytes = _train.peak_rss_bytes
current_rss_bytes = _train.current_rss_bytes
write_line_plot_png = _train.write_line_plot_png

__all__ = [
    "BatchSampler",
    "Corpus",
    "CorpusSplit",
    "GPTTrainer",
    "LrSchedule",
    "OptimizerConfig",
    "ParallelLayout",
    "StepStats",
    "TrainerOptions",
    "current_rss_bytes",
    "default_corpus_path",
    "format_bytes",
    "format_duration",
    "format_step_line",
    "peak_rss_bytes",
    "render_progress",
    "write_line_plot_png",
]
