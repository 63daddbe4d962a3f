"""Memory-saving training, measured: prints each figure and PASS/FAIL against its target.

    python benchmarks/bench_memory.py [--quick] [--png benchmarks/memory_vs_layers.png]

Sections: gradient checkpointing on MLPs of L = 16, 64, 256 layers (peak activation bytes and
step time; memory-vs-L PNG when matplotlib is installed), mixed precision (bytes and final
loss), estimator vs MemoryTracker, LoRA/QLoRA (bytes/param, NF4 error, fine-tuning loss),
Adafactor vs Adam state bytes, and CPU offload of optimizer state (GPU only).
Run it on a quiet machine: timings share the CPU with everything else.
"""
import argparse
import math
import time
from typing import Dict, List, Tuple

import numpy as np

import needle as ndl
from needle import nn
from needle.amp import GradScaler, autocast
from needle.memory import MemoryTracker, OffloadOptimizer, bytes_of, checkpoint_sequential
from needle.memory.estimator import estimate_module

RESULTS: List[Tuple[str, bool]] = []


def check(name: str, ok: bool, detail: str) -> None:
    """Print one PASS/FAIL line and remember it."""
    RESULTS.append((name, ok))
    print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")


def _mlp(depth: int, width: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                           for _ in range(depth)])


def _segments(n: int) -> int:
    """sqrt(2n) segments: each needle layer keeps ~3 tensors per boundary tensor (see README)."""
    return max(1, round(math.sqrt(2 * n)))


def _run(model: nn.Sequential, x: ndl.Tensor, ckpt: bool) -> None:
    for p in model.parameters():
        p.grad = None
    out = checkpoint_sequential(model, _segments(len(model)), x) if ckpt else model(x)
    (out * out).sum().backward(create_graph=False)


def _peak(model: nn.Sequential, x: ndl.Tensor, ckpt: bool) -> int:
    """Peak activation bytes of one forward+backward (MemoryTracker, exact on the CPU)."""
    with MemoryTracker() as tr:
        _run(model, x, ckpt)
        tr.classify(parameters=model.parameters())
    return tr.peak_excluding("gradients", "parameters")


def _times(model: nn.Sequential, x: ndl.Tensor, repeats: int) -> Tuple[float, float]:
    """Median seconds of (plain, checkpointed) steps, run alternately so that drift in the
    machine's speed (BLAS threads, other load) affects both the same way."""
    _run(model, x, False)  # warm-up: first-touch page faults of fresh buffers
    _run(model, x, True)
    times: Dict[bool, List[float]] = {False: [], True: []}
    for _ in range(repeats):
        for ckpt in (False, True):
            t0 = time.perf_counter()
            _run(model, x, ckpt)
            times[ckpt].append(time.perf_counter() - t0)
    return float(np.median(times[False])), float(np.median(times[True]))


def bench_checkpointing(depths: List[int], width: int, batch: int, repeats: int,
                        png: str) -> None:
    print(f"\n== gradient checkpointing: MLP width {width}, batch {batch}, sqrt(2L) segments ==")
    rows: Dict[int, Tuple[int, int, float, float]] = {}
    x = ndl.Tensor(np.random.randn(batch, width).astype(np.float32), requires_grad=False)
    for L in depths:
        model = _mlp(L, width)
        plain_m, ck_m = _peak(model, x, False), _peak(model, x, True)
        plain_t, ck_t = _times(model, x, repeats)
        rows[L] = (plain_m, ck_m, plain_t, ck_t)
        print(f"  L={L:4d}  plain {plain_m / 2**20:8.2f} MiB {plain_t * 1e3:8.1f} ms   "
              f"checkpointed ({_segments(L)} segments) {ck_m / 2**20:8.2f} MiB "
              f"{ck_t * 1e3:8.1f} ms   mem x{ck_m / plain_m:.3f}  time x{ck_t / plain_t:.2f}")
    lo, hi = min(depths), max(depths)
    slope_plain = math.log(rows[hi][0] / rows[lo][0]) / math.log(hi / lo)
    slope_ck = math.log(rows[hi][1] / rows[lo][1]) / math.log(hi / lo)
    check("plain activation memory grows ~linearly in L", 0.85 <= slope_plain <= 1.15,
          f"log-log slope {slope_plain:.2f}")
    check("checkpointed activation memory grows ~sqrt(L)", 0.35 <= slope_ck <= 0.65,
          f"log-log slope {slope_ck:.2f}")
    if 64 in rows:
        pm, cm, pt, ct = rows[64]
        check("L=64 peak activation memory <= 0.3x plain", cm <= 0.3 * pm, f"x{cm / pm:.3f}")
        check("L=64 step time <= 1.4x plain", ct <= 1.4 * pt, f"x{ct / pt:.2f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib not installed: no PNG; pip install matplotlib)")
        return
    ls = sorted(rows)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(ls, [rows[n][0] / 2**20 for n in ls], "o-", label="plain")
    ax.loglog(ls, [rows[n][1] / 2**20 for n in ls], "s-", label="checkpointed (sqrt(2L) segments)")
    ax.set_xticks(ls)
    ax.set_xticklabels([str(n) for n in ls])
    ax.minorticks_off()
    ax.set_xlabel("layers L")
    ax.set_ylabel("peak activation memory (MiB)")
    ax.set_title("needle: activation memory vs depth")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"  saved {png}")


def _amp_run(dtype, steps: int, x, y) -> Tuple[float, int]:
    np.random.seed(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(),
                          *[m for _ in range(4) for m in (nn.Linear(128, 128), nn.ReLU())],
                          nn.Linear(128, 10))
    opt = ndl.optim.Adam(model.parameters(), lr=2e-3)
    scaler, lossf = GradScaler(enabled=dtype is not None), nn.SoftmaxLoss()
    for _ in range(steps):
        opt.reset_grad()
        with autocast(dtype or "float16", enabled=dtype is not None):
            loss = lossf(model(x), y)
        scaler.scale(loss).backward(create_graph=False)
        scaler.step(opt)
        scaler.update()
    with MemoryTracker() as tr:
        with autocast(dtype or "float16", enabled=dtype is not None):
            loss = lossf(model(x), y)
        act = tr.current_bytes
    return float(loss.numpy()), act + bytes_of(model.parameters())


def bench_amp(steps: int) -> None:
    print(f"\n== mixed precision: 6-layer MLP, {steps} Adam steps ==")
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2048, 32)).astype(np.float32)
    ys = (xs @ rng.standard_normal((32, 10))).argmax(1)
    # 30% label noise: the loss plateaus well above zero, so "within 1%" compares converged
    # losses rather than the last digits of a loss that is still racing towards zero
    noisy = rng.random(len(ys)) < 0.3
    ys[noisy] = rng.integers(0, 10, noisy.sum())
    x = ndl.Tensor(xs, requires_grad=False)
    y = ndl.Tensor(ys, dtype="int64", requires_grad=False)
    ref_loss, ref_bytes = _amp_run(None, steps, x, y)
    print(f"  float32   loss {ref_loss:.5f}  params+activations {ref_bytes / 2**20:.2f} MiB")
    for dt, n in (("bfloat16", steps), ("float16", max(steps // 4, 3))):
        if n != steps:
            ref_loss_n, ref_bytes = _amp_run(None, n, x, y)
        else:
            ref_loss_n = ref_loss
        loss, nbytes = _amp_run(dt, n, x, y)
        print(f"  {dt:9s} loss {loss:.5f} (fp32 {ref_loss_n:.5f} after {n} steps)  "
              f"params+activations {nbytes / 2**20:.2f} MiB")
        check(f"{dt} params+activations <= 0.55x float32", nbytes <= 0.55 * ref_bytes,
              f"x{nbytes / ref_bytes:.3f}")
        check(f"{dt} final loss within 1% of float32", abs(loss - ref_loss_n) <= 0.01 *
              ref_loss_n, f"{100 * abs(loss - ref_loss_n) / ref_loss_n:.2f}%")


def bench_estimator() -> None:
    print("\n== estimator vs MemoryTracker (Adam, fp32) ==")
    for name, make, shape in (
            ("MLP 4x512", lambda: nn.Sequential(nn.Linear(256, 512), nn.ReLU(),
                                                nn.Linear(512, 512), nn.ReLU(),
                                                nn.Linear(512, 10)), (512, 256)),
    ):
        np.random.seed(0)
        with MemoryTracker() as tr:
            model = make()
            x = ndl.Tensor(np.random.randn(*shape).astype(np.float32), requires_grad=False)
            y = ndl.Tensor(np.random.randint(0, 10, shape[0]), dtype="int64",
                           requires_grad=False)
            opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
            for i in range(2):
                if i:
                    tr.reset_peak()
                opt.reset_grad()
                loss = nn.SoftmaxLoss()(model(x), y)
                loss.backward(create_graph=False)
                opt.step()
                del loss
            tr.classify(parameters=model.parameters(), optimizer=opt)
            cur = tr.current_by_category()
        states = cur["parameters"] + cur["gradients"] + cur["optimizer_state"]
        est = estimate_module(model, [x], loss_fn=lambda o: nn.SoftmaxLoss()(o, y))
        print("  " + est.report().replace("\n", "\n  "))
        check(f"{name}: model states within 5%", abs(est.model_states - states) <= 0.05 * states,
              f"estimate {est.model_states:,.0f} vs measured {states:,}")
        check(f"{name}: peak within 20%", abs(est.total - tr.peak_bytes) <= 0.2 * tr.peak_bytes,
              f"estimate {est.total:,.0f} vs measured {tr.peak_bytes:,}")


def bench_lora(steps: int) -> None:
    print("\n== LoRA / QLoRA ==")
    w = (np.random.randn(1024, 1024) * 0.02).astype(np.float32)
    for dq in (False, True):
        q = nn.quantize_nf4(ndl.Tensor(w), double_quant=dq)
        d = q.dequantize()
        err = np.sqrt(((d - w) ** 2).mean()) / w.std()
        print(f"  NF4 double_quant={dq}: {q.bytes_per_param():.4f} bytes/param "
              f"(float32: 4), relative RMS error {err:.4f}")
        check(f"NF4 bytes/param (dq={dq}) ~0.5 + scales", q.bytes_per_param() <= 0.57,
              f"{q.bytes_per_param():.4f}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    delta = rng.standard_normal((64, 4)) @ rng.standard_normal((4, 64)) * 0.2
    final = {}
    for mode in ("full", "lora", "qlora"):
        np.random.seed(0)
        model = nn.Sequential(nn.Linear(64, 64))
        target = x @ (model.modules[0].weight.numpy() + delta) + model.modules[0].bias.numpy()
        if mode == "lora":
            nn.apply_lora(model, r=4, alpha=16)
        elif mode == "qlora":
            nn.apply_qlora(model, r=4, alpha=16)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = ndl.optim.Adam(params, lr=0.02)
        xt = ndl.Tensor(x, requires_grad=False)
        yt = ndl.Tensor(target, dtype="float32", requires_grad=False)
        for _ in range(steps):
            opt.reset_grad()
            loss = ((model(xt) - yt) ** 2).sum() / x.shape[0]
            loss.backward(create_graph=False)
            opt.step()
        final[mode] = float(loss.numpy())
        state = bytes_of([v for s in opt.state.values() for v in s.values()
                          if not isinstance(v, int)])
        print(f"  {mode:5s} fine-tune: final loss {final[mode]:.5f}, trainable "
              f"{sum(int(np.prod(p.shape)) for p in params):,} params, optimizer state "
              f"{state:,} B")
    start = float((((x @ delta) ** 2).sum()) / x.shape[0])
    check("QLoRA fine-tuning loss close to full fine-tuning",
          final["qlora"] <= final["full"] + 0.01 * start,
          f"{final['qlora']:.4f} vs {final['full']:.4f} (start {start:.3f})")


def bench_adafactor() -> None:
    print("\n== Adafactor vs Adam optimizer state ==")
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
    x = ndl.Tensor(np.random.randn(8, 512).astype(np.float32), requires_grad=False)
    sizes = {}
    for name, make in (("Adam", ndl.optim.Adam), ("Adafactor", ndl.optim.Adafactor)):
        opt = make(model.parameters())
        opt.reset_grad()
        model(x).sum().backward(create_graph=False)
        with MemoryTracker() as tr:
            opt.step()
            tr.classify(parameters=model.parameters(), optimizer=opt)
        sizes[name] = tr.current_by_category()["optimizer_state"]
        print(f"  {name:9s} state {sizes[name]:>12,} B")
    check("Adafactor state O(n+m): < 1% of Adam's", sizes["Adafactor"] < 0.01 * sizes["Adam"],
          f"x{sizes['Adafactor'] / sizes['Adam']:.4f}")


def bench_offload() -> None:
    print("\n== CPU offload of optimizer state ==")
    if not ndl.cuda().enabled():
        print("  (no GPU: skipped)")
        return
    dev = ndl.cuda()
    for offload in (False, True):
        np.random.seed(0)
        model = nn.Sequential(nn.Linear(2048, 2048, device=dev), nn.ReLU(),
                              nn.Linear(2048, 2048, device=dev))
        x = ndl.Tensor(np.random.randn(64, 2048).astype(np.float32), device=dev,
                       requires_grad=False)
        opt = (OffloadOptimizer(ndl.optim.Adam, model.parameters(), lr=1e-3) if offload
               else ndl.optim.Adam(model.parameters(), lr=1e-3))
        with MemoryTracker(dev) as tr:
            t0 = time.perf_counter()
            for _ in range(3):
                opt.reset_grad()
                model(x).sum().backward(create_graph=False)
                opt.step()
            float(model(x).sum().numpy())
            sec = (time.perf_counter() - t0) / 3
        print(f"  offload={offload}: GPU bytes after steps {tr.current_bytes:,}, "
              f"peak {tr.peak_bytes:,}, {sec * 1e3:.1f} ms/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a sanity run")
    ap.add_argument("--png", default="benchmarks/memory_vs_layers.png")
    args = ap.parse_args()
    np.random.seed(0)
    if args.quick:
        bench_checkpointing([16, 64], 32, 256, 1, args.png)
        bench_amp(6)
    else:
        bench_checkpointing([16, 64, 256], 64, 1024, 7, args.png)
        bench_amp(40)
    bench_estimator()
    bench_lora(40 if args.quick else 150)
    bench_adafactor()
    bench_offload()
    failed = [n for n, ok in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed"
          + (": FAILED " + "; ".join(failed) if failed else ""))


if __name__ == "__main__":
    main()
