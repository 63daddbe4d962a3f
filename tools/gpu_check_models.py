"""``tools/gpu_check.py``'s model sections: one training step of the course's ResNet9 and of the
transformer LM (``apps/models.py``) beside PyTorch eager, and the emulator against the GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
from gpu_check_sections import _sync, _torch_cuda, emit, timed

OPS = ("add", "exp", "sum_rows", "matmul_tiled", "matmul_cublas", "softmax", "layer_norm",
       "adam")


def _needle_step(model: Any, loss_fn: Any, x: Any, y: Any, opt: Any,
                 amp: Optional[str] = None) -> Callable[[], None]:
    """One training step; with ``amp``, forward and loss under ``needle.amp.autocast(amp)``."""
    from needle.amp import autocast

    def step() -> None:
        opt.reset_grad()
        with autocast(amp or "float16", enabled=amp is not None):
            out = model(x)
            loss = loss_fn(out[0] if isinstance(out, tuple) else out, y)
        loss.backward(create_graph=False)
        opt.step()
    return step


def _torch_resnet9(torch: Any) -> Any:
    nn = torch.nn

    def cbn(a: int, b: int, k: int, s: int) -> Any:
        return nn.Sequential(nn.Conv2d(a, b, k, s, k // 2), nn.BatchNorm2d(b), nn.ReLU())

    class Res(nn.Module):
        def __init__(self, f: Any) -> None:
            super().__init__()
            self.f = f

        def forward(self, x: Any) -> Any:
            return x + self.f(x)
    return nn.Sequential(cbn(3, 16, 7, 4), cbn(16, 32, 3, 2),
                         Res(nn.Sequential(cbn(32, 32, 3, 1), cbn(32, 32, 3, 1))),
                         cbn(32, 64, 3, 2), cbn(64, 128, 3, 2),
                         Res(nn.Sequential(cbn(128, 128, 3, 1), cbn(128, 128, 3, 1))),
                         nn.Flatten(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _torch_lm(torch: Any, vocab: int, d: int, hidden: int, layers: int, heads: int) -> Any:
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, heads, hidden, dropout=0.0, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.out = nn.Linear(d, vocab)

        def forward(self, ids: Any) -> Any:  # (T, B) -> (T * B, vocab)
            t = ids.shape[0]
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
            return self.out(self.enc(self.emb(ids), mask=mask, is_causal=True).reshape(-1, d))
    return LM()


def _torch_step(torch: Any, model: Any, x: Any, y: Any) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def train_step(dry: bool) -> None:
    """One optimizer step of ResNet9 and of the transformer LM: needle and PyTorch eager."""
    import needle as ndl
    from apps.models import ResNet9
    torch = _torch_cuda(dry)
    sync, reps, dev = _sync(torch), 1 if dry else 10, ndl.cuda()
    rng = np.random.default_rng(0)
    batch = 2 if dry else 128
    img = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
    lab = rng.integers(0, 10, batch)
    net = ResNet9(device=dev)
    s = timed(_needle_step(net, ndl.nn.SoftmaxLoss(), ndl.Tensor(img, device=dev),
                           ndl.Tensor(lab, device=dev, dtype="int64"),
                           ndl.optim.Adam(net.parameters(), lr=1e-3)), sync, reps)
    row: Dict[str, Any] = {"model": f"ResNet9 batch {batch}", "needle_ms": round(s * 1e3, 2)}
    if torch is not None:
        tnet = _torch_resnet9(torch).cuda()
        row["torch_ms"] = round(timed(_torch_step(torch, tnet, torch.tensor(img, device="cuda"),
                                                  torch.tensor(lab, device="cuda")), sync,
                                      reps) * 1e3, 2)
    emit(**row, mode="emulated" if dry else "gpu")
    lm, ids, shape = _language_model(dry, dev, rng)
    s = timed(_lm_step(lm, ids), sync, reps)
    row = {"model": "transformer LM " + shape, "needle_ms": round(s * 1e3, 2)}
    if torch is not None:
        t, b, vocab, d, hidden, layers, heads = LM_SIZES[dry]
        tlm = _torch_lm(torch, vocab, d, hidden, layers, heads).cuda()
        tid = torch.tensor(ids.numpy(), device="cuda")
        row["torch_ms"] = round(timed(_torch_step(torch, tlm, tid, tid.reshape(-1)), sync,
                                      reps) * 1e3, 2)
    emit(**row, mode="emulated" if dry else "gpu")
    s16 = timed(_lm_step(lm, ids, amp="float16"), sync, reps)
    emit(model="transformer LM " + shape + ", float16 autocast", needle_ms=round(s16 * 1e3, 2),
         speedup_vs_float32=round(s / s16, 2), mode="emulated" if dry else "gpu")

def _graph_run(model: Any, x: Any, y: Any, mode: str, steps: int) -> Tuple[list, Any]:
    """``steps`` Adam steps with the forward and backward under ``needle.compile(mode=...)``:
    (the losses, the compiled function); ``fn.step`` runs one more."""
    import needle as ndl
    opt, loss_fn = ndl.optim.Adam(model.parameters(), lr=1e-3), ndl.nn.SoftmaxLoss()

    def fwd_bwd(a: Any, b: Any) -> Any:
        out = model(a)
        loss = loss_fn(out[0] if isinstance(out, tuple) else out, b)
        loss.backward()
        return loss
    fn = ndl.compile(fwd_bwd, mode=mode)

    def step() -> Any:
        loss = fn(x, y)
        opt.step()
        opt.reset_grad()
        return loss
    fn.step = step
    return [float(step().numpy()) for _ in range(steps)], fn


def cuda_graphs(dry: bool) -> None:
    """ResNet9 and the LM compiled with ``mode="reduce-overhead"`` (one CUDA graph per step):
    captured, equal to plain replay over several steps, and timed beside PyTorch eager (and
    ``torch.compile(mode="reduce-overhead")`` where it runs)."""
    import needle as ndl
    from apps.models import ResNet9
    torch = _torch_cuda(dry)
    sync, reps, dev = _sync(torch), 1 if dry else 20, ndl.cuda()
    rng = np.random.default_rng(0)
    batch = 2 if dry else 128
    img = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
    lab = rng.integers(0, 10, batch)
    cases = [("ResNet9 batch %d" % batch, lambda: ResNet9(device=dev),
              ndl.Tensor(img, device=dev), ndl.Tensor(lab, device=dev, dtype="int64"))]
    lm_seed = np.random.default_rng(0)
    _, ids, shape = _language_model(dry, dev, lm_seed)
    cases.append(("transformer LM " + shape,
                  lambda: _language_model(dry, dev, np.random.default_rng(0))[0], ids,
                  ids.reshape((-1,))))
    for name, make, x, y in cases:
        losses = {}
        for mode in ("default", "reduce-overhead"):
            np.random.seed(0)
            losses[mode], fn = _graph_run(make(), x, y, mode, 4)
        row: Dict[str, Any] = {"model": name, "graph": "one graph launch" in fn.explain(),
                               "max_diff_vs_plain": float(np.max(np.abs(
                                   np.subtract(losses["default"], losses["reduce-overhead"]))))}
        row["needle_graph_ms"] = round(timed(fn.step, sync, reps) * 1e3, 2)
        if torch is not None:
            row.update(_torch_times(torch, name, img, lab, ids, sync, reps))
        emit(**row, mode="emulated" if dry else "gpu")


def _torch_times(torch: Any, name: str, img: Any, lab: Any, ids: Any, sync: Any,
                 reps: int) -> Dict[str, Any]:
    """PyTorch eager's step time, and torch.compile(mode="reduce-overhead")'s where it runs."""
    if name.startswith("ResNet9"):
        model, x, y = (_torch_resnet9(torch).cuda(), torch.tensor(img, device="cuda"),
                       torch.tensor(lab, device="cuda"))
    else:
        t, b, vocab, d, hidden, layers, heads = LM_SIZES[False]
        model = _torch_lm(torch, vocab, d, hidden, layers, heads).cuda()
        x = torch.tensor(ids.numpy(), device="cuda")
        y = x.reshape(-1)
    out = {"torch_eager_ms": round(timed(_torch_step(torch, model, x, y), sync, reps) * 1e3, 2)}
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        out["torch_compile_ro_ms"] = round(timed(_torch_step(torch, compiled, x, y), sync,
                                                 reps) * 1e3, 2)
    except Exception as e:  # no Triton / no compiler on the machine: say so
        out["torch_compile_ro"] = f"did not run: {type(e).__name__}: {str(e)[:120]}"
    return out


# (T, B, vocab, d, hidden, layers, heads): the GPU run's, a dry run's
LM_SIZES = {False: (128, 32, 8192, 512, 2048, 4, 8), True: (8, 2, 50, 16, 32, 1, 2)}


def _language_model(dry: bool, dev: Any, rng: np.random.Generator) -> Tuple[Any, Any, str]:
    """The course's transformer LM (``apps/models.py``), token ids, and its shape in words."""
    import needle as ndl
    from apps.models import LanguageModel
    t, b, vocab, d, hidden, layers, heads = LM_SIZES[dry]
    lm = LanguageModel(d, vocab, hidden, layers, seq_model="transformer", seq_len=t,
                       device=dev, num_head=heads, dim_head=d // heads, dropout=0.0,
                       causal=True)
    ids = ndl.Tensor(rng.integers(0, vocab, (t, b)), device=dev, dtype="int64")
    return lm, ids, f"T={t} B={b} d={d} L={layers}"


def _lm_step(lm: Any, ids: Any, amp: Optional[str] = None) -> Callable[[], None]:
    import needle as ndl
    return _needle_step(lm, ndl.nn.SoftmaxLoss(), ids, ids.reshape((-1,)),
                        ndl.optim.Adam(lm.parameters(), lr=1e-3), amp)


def _where(path: str) -> str:
    """The layer a profiled function lives in, from its file."""
    for part in ("autograd", "ops", "nn", "optim", "backend_ndarray", "backend_cuda", "cupy"):
        if f"/{part}/" in path or f"/{part}." in path or path.startswith(f"{part}."):
            return part
    return "built-in" if path == "~" else "other"


def step_profile(dry: bool) -> None:
    """Where a transformer LM step's wall time goes: the host's Python by layer and by
    function (cProfile over a few steps, synchronized), and the calls per step, so a gap to
    PyTorch reads as host work or GPU work."""
    import cProfile
    import pstats

    import needle as ndl
    dev, reps = ndl.cuda(), 1 if dry else 3
    lm, ids, shape = _language_model(dry, dev, np.random.default_rng(0))
    step, sync = _lm_step(lm, ids), _sync(None)
    wall = timed(step, sync, reps)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        step()
    sync()
    prof.disable()
    st: Any = pstats.Stats(prof)
    layers: Dict[str, float] = {}
    for (path, _, _), (_, _, own, _, _) in st.stats.items():
        layer = _where(path)
        layers[layer] = layers.get(layer, 0.0) + own / reps
    mode = "emulated" if dry else "gpu"
    emit(model="transformer LM " + shape, wall_ms=round(wall * 1e3, 2),
         profiled_ms=round(st.total_tt / reps * 1e3, 2),
         calls_per_step=sum(v[1] for v in st.stats.values()) // reps, mode=mode)
    for layer, own in sorted(layers.items(), key=lambda kv: -kv[1]):
        emit(layer=layer, own_ms_per_step=round(own * 1e3, 2), mode=mode)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]
    for (path, line, name), (_, calls, own, _, _) in top:
        emit(function=f"{Path(path).name}:{line}({name})", calls_per_step=calls // reps,
             own_ms_per_step=round(own / reps * 1e3, 2), mode=mode)


def step_counts(dry: bool) -> None:
    """Per training step of the LM and ResNet9, phase by phase: kernel launches, CuPy library
    calls, allocations, copies, synchronisations and Python calls, read at the emulator's CuPy
    surface (``benchmarks/bench_step_counts.py``; the counts follow the program, not the card),
    and the host's microseconds per device op with kernel bodies skipped (this host's CPU)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, NEEDLE_CUDA_EMULATOR="force")
    res = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_step_counts.py"),
                          "--json", "--reps", "2" if dry else "5"], env=env, check=True,
                         capture_output=True, text=True)
    for line in res.stdout.splitlines():
        rep = json.loads(line)
        for phase, row in (*rep["phases"].items(), ("total", rep["total"])):
            counted = {k: v for k, v in row.items() if k != "by_name"}
            emit(model=rep["model"], phase=phase, **counted, mode="emulated")
        emit(model=rep["model"], host_us_per_device_op=rep["host_us_per_device_op"],
             mode="emulated")


# ---------------------------------------------------------------------- emulator vs GPU
def op_results(device: Any) -> Dict[str, np.ndarray]:
    """Each op of ``OPS`` on fixed inputs on ``device``, as NumPy."""
    from needle.backend_ndarray import NDArray
    from needle.backend_ndarray import fused_ops as F
    rng = np.random.default_rng(1)
    x, m = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal((33, 70),
                                                                            dtype=np.float32)
    a, b, mm = NDArray(x, device=device), NDArray(x[::-1].copy(), device=device), NDArray(
        m, device=device)
    out = {"add": a + b, "exp": a.exp(), "sum_rows": mm.sum(axis=1), "softmax": F.softmax(mm),
           "layer_norm": F.layer_norm(mm, NDArray(np.ones(70, np.float32), device=device),
                                      NDArray(np.zeros(70, np.float32), device=device))[0]}
    mod = getattr(device, "set_matmul_kernel", None)
    for path in ("tiled", "cublas"):
        if mod is not None:
            mod(path)
        out["matmul_" + path] = mm @ mm.permute((1, 0))
    if mod is not None:
        mod("cublas")
    mom = [NDArray(np.zeros(1000, np.float32), device=device) for _ in range(2)]
    F.multi_tensor_adam([a], [b], [mom[0]], [mom[1]], [0], [1], F.MultiTensorState(device, 1),
                        1e-2)
    out["adam"] = a
    return {k: v.numpy() for k, v in out.items()}


def emu_vs_gpu(dry: bool, save: str = "") -> None:
    """The emulator's results (a subprocess with NEEDLE_CUDA_EMULATOR=force) against the GPU's;
    in a dry run, against the CPU backend's (no GPU)."""
    import needle as ndl
    if save:
        np.savez(save, **op_results(ndl.cuda()))
        return
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_emu_{os.getpid()}.npz"
    env = dict(os.environ, NEEDLE_CUDA_EMULATOR="force")
    subprocess.run([sys.executable, __file__, "emu-ops", str(path)], env=env, check=True)
    emu = dict(np.load(path))
    path.unlink()
    other, label = (ndl.cpu(), "cpu backend") if dry else (ndl.cuda(), "gpu")
    ref = op_results(other)
    for name in OPS:
        err = float(np.abs(emu[name] - ref[name]).max() / max(np.abs(ref[name]).max(), 1e-30))
        emit(op=name, emulator_vs=label, max_rel_err=f"{err:.2e}", ok=err < 1e-4,
             mode="emulated" if dry else "gpu")
        if not err < 1e-4:
            raise SystemExit(f"{name}: the emulator and the {label} differ by {err:.2e}")


if __name__ == "__main__" and sys.argv[1:2] == ["emu-ops"]:
    emu_vs_gpu(False, save=sys.argv[2])
