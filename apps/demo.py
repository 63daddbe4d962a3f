"""`make demo`: train two real models on data that ships with the machine, in about a minute.

1. An MLPResNet on scikit-learn's 8x8 digits (fixed 80/20 split) -> test accuracy.
2. A small character-level Transformer on Python's own standard-library sources for a fixed
   time budget -> held-out loss beside the corpus's unigram entropy, and a generated sample.
3. The digits model on 2 ranks with DistributedDataParallel (``apps/train_parallel.py`` through
   ``needle.parallel.launch``): the same parameters as one process, and the speedup.

Run from the repository root: ``python3 -m apps.demo`` (``--help`` for options).
"""
import itertools
import math
import time
from typing import List, Optional

import numpy as np

import needle as ndl
from needle import nn
from needle.cli import Parser

if __package__:  # imported as apps.<module>
    from .mlp_resnet import MLPResNet, epoch
    from .models import LanguageModel
    from .progress import Progress
else:  # the course's way: sys.path.append("./apps"); from <module> import *
    from mlp_resnet import MLPResNet, epoch
    from models import LanguageModel
    from progress import Progress


def digits_demo(epochs: int = 20, progress: Optional[bool] = None) -> float:
    """Train MLPResNet on the built-in digits; returns the test accuracy."""
    np.random.seed(0)
    train, test = ndl.data.digits_datasets(test_fraction=0.2, seed=0)
    train_loader = ndl.data.DataLoader(train, batch_size=64, shuffle=True, seed=0)
    test_loader = ndl.data.DataLoader(test, batch_size=256)
    model = MLPResNet(64, hidden_dim=128, num_blocks=2, num_classes=10, drop_prob=0.1)
    opt = ndl.optim.Adam(model.parameters(), lr=0.002, weight_decay=1e-4)
    start = time.perf_counter()
    for _ in range(epochs):
        train_err, train_loss = epoch(train_loader, model, opt, progress, seed=None)
    test_err, test_loss = epoch(test_loader, model, None, progress, seed=None)
    print(f"[digits] MLPResNet, {len(train)} train / {len(test)} test images, {epochs} epochs "
          f"in {time.perf_counter() - start:.1f}s: train loss {train_loss:.3f}, "
          f"test accuracy {100 * (1 - test_err):.1f}%")
    print(_note("digits", "10 classes, so guessing scores 10%; about 97-98% is expected here, "
                          "on test images the model never trained on"))
    return 1.0 - test_err


def _sample(model: LanguageModel, corpus: ndl.data.CharCorpus, prompt: str, n_chars: int,
            seq_len: int, temperature: float, rng: np.random.Generator) -> str:
    """Generate ``n_chars`` characters after ``prompt`` (a sliding window of ``seq_len``)."""
    model.eval()
    ids: List[int] = corpus.encode(prompt)
    with ndl.no_grad():
        for _ in range(n_chars):
            ctx = np.array(ids[-seq_len:], dtype=np.float32)[:, None]          # (T, 1)
            logits, _ = model(ndl.Tensor(ctx, requires_grad=False))
            z = logits.numpy()[-1].astype(np.float64) / temperature
            p = np.exp(z - z.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return corpus.decode(ids)


def _mean_loss(model: LanguageModel, batches: np.ndarray, seq_len: int) -> float:
    model.eval()
    loss_fn, total, n = nn.SoftmaxLoss(), 0.0, 0
    with ndl.no_grad():
        for i in range(0, batches.shape[0] - 1, seq_len):
            x, y = ndl.data.get_batch(batches, i, seq_len)
            logits, _ = model(x)
            total += float(loss_fn(logits, y).numpy()) * y.shape[0]
            n += y.shape[0]
    return total / n


def char_lm_demo(budget_s: float = 35.0, progress: Optional[bool] = None) -> float:
    """Train a character Transformer for ``budget_s`` seconds; returns held-out loss (nats)."""
    np.random.seed(0)
    corpus = ndl.data.CharCorpus(n_chars=400_000, test_fraction=0.05)
    vocab, seq_len, batch_size = len(corpus.dictionary), 48, 16
    train = ndl.data.batchify(corpus.train, batch_size)
    test = ndl.data.batchify(corpus.test, 16)
    model = LanguageModel(64, vocab, 128, num_layers=2, seq_model="transformer",
                          seq_len=seq_len, num_head=4, dim_head=16)
    opt = ndl.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.SoftmaxLoss()
    entropy = ndl.metrics.unigram_entropy(corpus.train)
    rng = np.random.default_rng(0)
    starts = np.arange(0, train.shape[0] - seq_len - 1)
    bar = Progress(itertools.count(), desc="char-transformer",
                   disable=None if progress is None else not progress)
    t0, steps = time.perf_counter(), 0
    model.train()
    for _ in bar:
        x, y = ndl.data.get_batch(train, int(rng.choice(starts)), seq_len)
        loss = loss_fn(model(x)[0], y)
        opt.reset_grad()
        loss.backward()
        opt.step()
        steps += 1
        bar.update(float(loss.numpy()), y.shape[0])
        if time.perf_counter() - t0 > budget_s:
            break
    bar.close()
    train_time = time.perf_counter() - t0
    held_out = _mean_loss(model, test, seq_len)
    print(f"[char-lm] Transformer (2 layers, d=64) on {len(corpus.train):,} characters of the "
          f"Python standard library, vocabulary {vocab}; {steps} steps in {train_time:.1f}s")
    print(f"[char-lm] unigram entropy {entropy:.3f} nats ({entropy / math.log(2):.3f} bits/char)"
          f"; held-out loss {held_out:.3f} nats ({held_out / math.log(2):.3f} bits/char)")
    print(_note("char-lm", "the unigram entropy is the loss of a model that knows only how "
                           "often each character occurs; a held-out loss below it means the model "
                           "uses the characters before; lower is better"))
    prompt = "def "
    text = _sample(model, corpus, prompt, 240, seq_len, 0.7, rng)
    print(f"[char-lm] a sample after the prompt {prompt!r} (temperature 0.7):")
    print(_note("char-lm", f"after {steps} steps of a small model expect Python's surface, "
                           "not Python: spaces and indentation, brackets, fragments such as "
                           "self. or def, and mostly made-up words; more steps (--budget) give "
                           "more real-looking code"))
    print("-" * 60 + "\n" + text + "\n" + "-" * 60)
    return held_out


def data_parallel_demo(steps: int = 30) -> None:
    """2 ranks of DDP through the launcher: equal to one process on the whole batch? faster?"""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/ddp.json"
        cmd = [sys.executable, "-m", "needle.parallel.launch", "-n", "2", "--no-prefix", "-m",
               "apps.train_parallel", "--strategy", "ddp", "--check", "--dtype", "float64",
               "--steps", str(steps), "--batch", "256", "--no-progress", "--json", path]
        one_thread = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                        "MKL_NUM_THREADS")}  # one BLAS thread per rank
        done = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, **one_thread})
        if done.returncode != 0:
            print("[ddp] the 2-rank run failed:\n" + done.stdout[-2000:] + done.stderr[-2000:])
            return
        with open(path) as f:
            out = json.load(f)
    print(f"[ddp] DistributedDataParallel, 2 ranks x 256 digits, {steps} Adam steps: loss "
          f"{out['first_loss']:.3f} -> {out['last_loss']:.3f}; parameters equal one process "
          f"on the whole batch to {out['max_param_diff_vs_single_process']:.1e} (float64)")
    print(_note("ddp", "the largest difference between a parameter trained on 2 ranks and "
                       "the same one trained in one process; float64 rounding alone is about "
                       "1e-16, so anything below 1e-12 means the same model"))
    speedup = out["single_process_step_ms"] / out["step_ms"]
    print(f"[ddp] step {out['step_ms']:.1f} ms on 2 ranks vs {out['single_process_step_ms']:.1f}"
          f" ms in one process: speedup {speedup:.2f}x")
    print(_speedup_note(speedup))


def _speedup_note(speedup: float) -> str:
    """What the DDP speedup means on this machine (its cores and their load)."""
    import os
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if speedup >= 1:
        return _note("ddp", "speedup = one-process step time / 2-rank step time: each rank's "
                            "half of the work saved more than exchanging the gradients cost.")
    shared = (f" Here, too, {cores} cores (load {load:.1f}) run both ranks and everything else."
              if (cores or 1) < 4 or load > (cores or 1) - 2 else "")
    return _note("ddp", "speedup = one-process step time / 2-rank step time. Below 1x is "
                        "expected here: every step the two ranks exchange all gradients (an "
                        "allreduce) and wait for each other, which on a model this small costs "
                        f"more than the half of the work each rank saves.{shared} What this run "
                        "shows is the equality above; data parallelism pays off when a step "
                        "computes much more than it communicates.")


def _note(tag: str, text: str) -> str:
    """``text`` in parentheses, wrapped under a ``[tag]`` line prefix."""
    import textwrap
    return textwrap.fill(f"({text})", width=100, initial_indent=f"[{tag}]   ",
                         subsequent_indent=f"[{tag}]    ")


def _train_step(model: nn.Module, opt: ndl.optim.Optimizer, x: ndl.Tensor, y: ndl.Tensor
                ) -> None:
    out = model(x)
    loss = nn.SoftmaxLoss()(out[0] if isinstance(out, tuple) else out, y)
    opt.reset_grad()
    loss.backward()
    opt.step()


def profile_demo_models(directory: str) -> None:
    """Write a trace and summary of one training step of each demo model under ``directory``
    (after one step unprofiled: the first fills caches)."""
    from needle import profiler
    np.random.seed(0)
    rng = np.random.default_rng(0)
    mlp = MLPResNet(64, hidden_dim=128, num_blocks=2, num_classes=10, drop_prob=0.1)
    digits = (ndl.Tensor(rng.standard_normal((64, 64)), dtype="float32", requires_grad=False),
              ndl.Tensor(rng.integers(0, 10, 64), dtype="int64", requires_grad=False))
    lm = LanguageModel(64, 96, 128, num_layers=2, seq_model="transformer", seq_len=48,
                       num_head=4, dim_head=16)
    chars = (ndl.Tensor(rng.integers(0, 96, (48, 16)), dtype="int64", requires_grad=False),
             ndl.Tensor(rng.integers(0, 96, 48 * 16), dtype="int64", requires_grad=False))
    for name, model, (x, y) in (("mlp_resnet", mlp, digits), ("char_transformer", lm, chars)):
        opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
        _train_step(model, opt, x, y)
        with profiler.profile_to(f"{directory}/{name}"):
            _train_step(model, opt, x, y)


def main(argv: Optional[List[str]] = None) -> None:
    """Run both demos."""
    parser = Parser(prog="python -m apps.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="digits epochs")
    parser.add_argument("--budget", type=float, default=35.0, help="char-LM seconds")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="only write a trace of one training step of each model to DIR")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, not {args.epochs}")
    if not 0 < args.budget < float("inf"):
        parser.error(f"--budget must be a positive number of seconds, not {args.budget}")
    if args.profile:
        profile_demo_models(args.profile)
        return
    progress = False if args.no_progress else None
    start = time.perf_counter()
    print(f"1/3: an MLP ResNet learns 8x8 digits ({args.epochs} epochs)", flush=True)
    digits_demo(args.epochs, progress)
    print(f"2/3: a character Transformer learns Python source for {args.budget:g}s", flush=True)
    char_lm_demo(args.budget, progress)
    print("3/3: the digits model on 2 processes with DistributedDataParallel", flush=True)
    data_parallel_demo()
    print(f"demo finished in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
