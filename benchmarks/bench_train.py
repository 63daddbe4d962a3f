"""Training-step time: needle (NumPy backend) beside PyTorch eager on the CPU, same threads.

One step = forward + loss + backward + Adam update, float32, in the same process:

* MLP 784-1024-1024-10 (ReLU), batch 256, softmax loss.   Target: needle <= 1.3x PyTorch.
* Transformer LM, 4 pre-norm layers, d=256, 8 heads x 32, FFN 1024, vocabulary 1000,
  sequence 128, batch 8, learned positions, causal attention written out as
  matmul -> masked softmax -> matmul in both frameworks.      Target: needle <= 1.5x PyTorch.

PyTorch gets ``torch.set_num_threads`` equal to the number of threads NumPy's BLAS uses (or
``--threads N`` for both). Times are wall-clock medians over ``--steps``, needle and PyTorch
timed in alternating blocks; run on a quiet machine (the load average is printed).
``--profile`` prints a cProfile of needle steps.

    python benchmarks/bench_train.py [--steps 10] [--threads N] [--only mlp|transformer]
"""
import cProfile
import io
import os
import pstats
import statistics
import time
from typing import Any, Callable, Dict, Optional

import numpy as np

import needle as ndl
from needle import cli, nn

TARGETS = {"mlp": 1.3, "transformer": 1.5}
VOCAB, D, HEADS, DH, FFN, LAYERS, SEQ, BATCH = 1000, 256, 8, 32, 1024, 4, 128, 8


# ------------------------------------------------------------------------- thread control
def blas_threads(requested: Optional[int]) -> int:
    """Limit NumPy's BLAS to ``requested`` threads (when given); return the count in use."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:  # threadpoolctl comes with scikit-learn, a needle dependency
        return requested or os.cpu_count() or 1
    if requested is not None:
        threadpool_limits(limits=requested, user_api="blas")
    counts = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    return max(counts) if counts else 1


def blas_setup() -> str:
    """The BLAS libraries threadpoolctl sees (version, kernel, threads) and the OpenBLAS
    variables that change the kernel chosen (they should be unset for figures)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    libs = [f"{p['internal_api']} {p.get('version', '?')} kernel {p.get('architecture', '?')} "
            f"{p['num_threads']} thread(s)" for p in threadpool_info() if p["user_api"] == "blas"]
    env = ", ".join(f"{v}={os.environ.get(v, 'unset')}"
                    for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"))
    return f"{'; '.join(libs) or 'no BLAS found'} ({env})"


def torch_threads(threads: int) -> Any:
    """The torch module set to ``threads`` threads, or None where torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


# ------------------------------------------------------------------------- needle steps
def needle_mlp_step() -> Callable[[], None]:
    """A closure running one needle MLP training step."""
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
    x = ndl.Tensor(np.random.rand(256, 784).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(np.random.randint(0, 10, 256), dtype="int64")
    loss_fn = nn.SoftmaxLoss()

    def step() -> None:
        opt.reset_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.numpy()
    return step


def needle_transformer_step() -> Callable[[], None]:
    """A closure running one needle Transformer-LM training step."""
    np.random.seed(0)
    # apps.models.LanguageModel(D, VOCAB, FFN, LAYERS, "transformer", SEQ), spelled out here
    # so the script runs from any directory
    emb = nn.Embedding(VOCAB, D, gather=True)
    body = nn.Transformer(D, FFN, LAYERS, num_head=HEADS, dim_head=DH, sequence_len=SEQ)
    head = nn.Linear(D, VOCAB)

    def model(tokens: ndl.Tensor) -> tuple:
        out, h = body(emb(tokens))                                           # (T, B, D)
        return head(out.reshape((SEQ * BATCH, D))), h

    params = emb.parameters() + body.parameters() + head.parameters()
    opt = ndl.optim.Adam(params, lr=1e-3)
    tokens = np.random.randint(0, VOCAB, size=(SEQ + 1, BATCH))
    x = ndl.Tensor(tokens[:-1], dtype="int64", requires_grad=False)        # (T, B)
    y = ndl.Tensor(tokens[1:].reshape(-1), dtype="int64", requires_grad=False)
    loss_fn = nn.SoftmaxLoss()

    def step() -> None:
        opt.reset_grad()
        logits, _ = model(x)
        loss = loss_fn(logits, y)
        loss.backward()
        opt.step()
        loss.numpy()
    return step


# ------------------------------------------------------------------------- torch steps
def torch_mlp_step() -> Callable[[], None]:
    """The same MLP step in PyTorch eager."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(256, 784)
    y = torch.randint(0, 10, (256,))

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    return step


def torch_transformer_step() -> Callable[[], None]:
    """The same Transformer-LM step in PyTorch eager (needle's layers, explicit attention)."""
    import torch
    from torch import nn as tnn

    class Layer(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_q, self.ln_k, self.ln_v = tnn.LayerNorm(D), tnn.LayerNorm(D), tnn.LayerNorm(D)
            self.q = tnn.Linear(D, HEADS * DH, bias=False)
            self.k = tnn.Linear(D, HEADS * DH, bias=False)
            self.v = tnn.Linear(D, HEADS * DH, bias=False)
            self.out = tnn.Linear(HEADS * DH, D, bias=False)
            self.ln = tnn.LayerNorm(D)
            self.ff1, self.ff2 = tnn.Linear(D, FFN), tnn.Linear(FFN, D)

        def heads(self, x: "torch.Tensor", ln: tnn.Module, proj: tnn.Module) -> "torch.Tensor":
            b, t, _ = x.shape
            return proj(ln(x)).reshape(b, t, HEADS, DH).transpose(1, 2)      # (B, nh, T, hs)

        def forward(self, x: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
            b, t, _ = x.shape
            q, k, v = (self.heads(x, self.ln_q, self.q), self.heads(x, self.ln_k, self.k),
                       self.heads(x, self.ln_v, self.v))
            att = (q @ k.transpose(-1, -2)) / DH ** 0.5 + mask               # (B, nh, T, T)
            y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, HEADS * DH)
            x = x + self.out(y)
            return x + self.ff2(torch.relu(self.ff1(self.ln(x))))

    class LM(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = tnn.Embedding(VOCAB, D), tnn.Embedding(SEQ, D)
            self.layers = tnn.ModuleList([Layer() for _ in range(LAYERS)])
            self.head = tnn.Linear(D, VOCAB)

        def forward(self, tokens: "torch.Tensor") -> "torch.Tensor":
            t = tokens.shape[0]
            x = (self.emb(tokens) + self.pos(torch.arange(t))[:, None, :]).transpose(0, 1)
            mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            for layer in self.layers:
                x = layer(x, mask)
            return self.head(x.transpose(0, 1).reshape(t * tokens.shape[1], D))

    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (SEQ + 1, BATCH))
    x, y = tokens[:-1], tokens[1:].reshape(-1)

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    return step


# ------------------------------------------------------------------------- driver
def time_ms(step: Callable[[], None], steps: int, warmup: int = 2) -> float:
    """Median wall-clock milliseconds per call after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_pair_ms(step_a: Callable[[], None], step_b: Callable[[], None], steps: int,
                 rounds: int = 3) -> "tuple[float, float]":
    """Median milliseconds of two steps timed in alternating blocks of ``steps // rounds``.

    Alternating lets a change in the machine's speed during the run (other tenants) land on
    both alike; whole blocks (not single steps) keep one library's BLAS/OpenMP threads, still
    spinning after its step, from stealing the cores of the other's next step. The first step
    of each block is a warm-up and is not timed.
    """
    block = max(1, steps // rounds)
    times_a: list = []
    times_b: list = []
    for _ in range(rounds):
        for step, times in ((step_a, times_a), (step_b, times_b)):
            step()
            for _ in range(block):
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times_a), statistics.median(times_b)


def profile(step: Callable[[], None], name: str, steps: int = 3, top: int = 25) -> None:
    """Print where a needle step spends its time (cProfile, sorted by own time)."""
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(f"\n--- cProfile of {steps} needle {name} steps (sorted by own time) ---")
    print(out.getvalue())


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=cli.count_type(lo=1), default=15)
    parser.add_argument("--threads", type=cli.count_type(lo=1), default=None,
                        help="BLAS and torch threads")
    parser.add_argument("--only", choices=sorted(TARGETS), default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile the needle steps")
    args = parser.parse_args()

    threads = blas_threads(args.threads)
    torch = torch_threads(threads)
    print(f"threads: numpy BLAS {threads}, torch "
          f"{torch.get_num_threads() if torch else 'not installed'}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    benches: Dict[str, tuple] = {"mlp": (needle_mlp_step, torch_mlp_step),
                                 "transformer": (needle_transformer_step, torch_transformer_step)}
    failed = False
    print(f"{'benchmark':<12} {'needle ms':>10} {'torch ms':>10} {'ratio':>7} {'target':>7}")
    for name, (make_needle, make_torch) in benches.items():
        if args.only and name != args.only:
            continue
        step = make_needle()
        if torch is None:
            n_ms = time_ms(step, args.steps)
            print(f"{name:<12} {n_ms:>10.1f} {'-':>10} {'-':>7} {TARGETS[name]:>6.1f}x  SKIP")
            continue
        n_ms, t_ms = time_pair_ms(step, make_torch(), args.steps)
        ratio = n_ms / t_ms
        ok = ratio <= TARGETS[name]
        failed |= not ok
        print(f"{name:<12} {n_ms:>10.1f} {t_ms:>10.1f} {ratio:>6.2f}x {TARGETS[name]:>6.1f}x  "
              f"{'PASS' if ok else 'FAIL'}")
        if args.profile:
            profile(step, name)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
