"""needle.plan's predictions against runs under mpiexec: per-rank peak memory, bytes sent per
step, step time, and the ranking of strategies, at 2 and 4 ranks.

    python benchmarks/bench_plan.py [--ranks 2 4] [--steps 6] [--reps 3] [--json out.json]

Each strategy runs in ``plan_worker.py`` (the real strategies of apps/: DDP, ZeRO-1/2 and FSDP
(ZeRO-3) on the course's MLPResNet for digits; TP, PP (1F1B, 4 microbatches) and 3D (dp 2 x
pp 2) on the character transformer). Predictions, made here without running the strategy:

* memory: ``needle.memory.estimate_module`` (measured forward graph, backward liveness
  replay, model states) of what one rank holds: DDP / ZeRO-1/2 the model on its batch plus
  ``needle_buffer_bytes``; FSDP the same sharded plus ``fsdp_buffer_bytes`` (each unit's
  gathered parameters and reduce-scatter buffers over backward, placed by the graph's order);
  TP each rank's own shard and graph (virtual cluster); PP / 3D each stage's graph times the
  microbatches 1F1B keeps in flight (``in_flight_microbatches``), the busiest stage;
* bytes: needle's own rules (``needle_strategies``: DDP / ZeRO-1/2 buckets, FSDP units, TP
  blocks, PP sends and the loss broadcast, 3D's per-gradient dp allreduces);
* time (``--cluster here``): one-rank runs of each model, with the BLAS threads each rank
  of the runs gets, measured in every round of a rank count's block (``--reps`` rounds, each
  the references then every strategy, so a row and its reference alternate in time; each
  figure is the median of the rounds, printed with its spread (max - min) / median; each run
  times ``--steps`` steps after 2 warm-up steps). DP: a rank's step is the strategy's own
  one-rank step (its framework time included) times the core-sharing factor. TP / PP / 3D: the
  char transformer's one-rank step at batch 16 and 4 fits per-op and per-byte costs
  (``fit_step_cost``: the same ops, 4x fewer bytes), applied to each rank's own forward graph
  (ops, bytes), per microbatch for a stage, backward twice the forward, times the factor. The
  factor is measured, not cores / p: ``needle/plan/core_sharing.py``, synchronised needle work
  (a small MLP's steps, then an allreduce) at p ranks against one rank, in every round (1.0
  at 2 ranks, 2.2-2.4 for 4 ranks on 2 cores). Plus the alpha-beta time of the predicted
  collectives (alpha, beta by ping-pong with that many ranks running; no overlap: shared
  cores leave none); PP and 3D through the schedule simulator. numpy GEMM FLOP/s are
  measured too (every rank at once, column "GEMM N/1": the rate at N ranks over the one-rank
  run's).
"""
import json
import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import needle as ndl  # noqa: E402
from benchmarks.needle_strategies import (  # noqa: E402
    fsdp_buffer_bytes,
    fsdp_unit_spans,
    needle_buffer_bytes,
    needle_collectives,
    needle_fsdp_collectives,
    needle_pp_collectives,
    needle_tp_collectives,
)
from needle import cli, nn  # noqa: E402
from needle.autograd import find_topo_sort  # noqa: E402
from needle.memory.estimator import estimate_module  # noqa: E402
from needle.parallel import mpiexec, virtual  # noqa: E402
from needle.parallel.threads import ENV_VARS, threads_per_rank  # noqa: E402
from needle.plan.bubble import pipeline_seconds  # noqa: E402
from needle.plan.cluster import (  # noqa: E402
    ClusterSpec,
    measure_alpha_beta,
    measure_core_sharing,
)
from needle.plan.comm_time import (  # noqa: E402
    Collective,
    comm_seconds,
    layout_collectives,
    step_bytes,
)
from needle.plan.core_sharing import sharing_factor  # noqa: E402
from needle.plan.gpu_memory import in_flight_microbatches  # noqa: E402
from needle.plan.layout import Layout, Setup  # noqa: E402
from needle.plan.model import ModelSpec  # noqa: E402

DP = ("ddp", "zero1", "zero2", "zero3")
MP = ("tp", "pp", "3d")
ZERO = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "single": 0}


def run_worker(strategy: str, ranks: int, steps: int, timeout: float,
               blas_threads: int = 0, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Launch plan_worker.py under mpiexec; its JSON figures. ``blas_threads``: fix the
    BLAS/OpenMP threads per rank (0: needle's own choice, ``parallel.threads``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if blas_threads:
            env.update(dict.fromkeys(ENV_VARS, str(blas_threads)))
        cmd = mpiexec.python_command(ranks, str(ROOT / "benchmarks" / "plan_worker.py"),
                                     strategy, str(out), "--steps", str(steps), *extra)
        subprocess.run(cmd, check=True, timeout=timeout, env=env, capture_output=True, cwd=ROOT)
        return json.loads(out.read_text())


def _digits_model() -> Any:
    from apps import data_parallel_strategies as dps
    args = SimpleNamespace(seed=0, dtype="float32", batch=32, device=ndl.cpu())
    return dps.TASKS["digits"](args, ndl.cpu()).model(0)


def predict_dp(strategy: str, p: int) -> Tuple[float, float, float]:
    """(peak bytes, bytes per step, FLOPs per rank) for a data-parallel strategy."""
    model = _digits_model()
    x = ndl.Tensor(np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32),
                   requires_grad=False)
    y = ndl.Tensor(np.zeros(32), dtype="int64", requires_grad=False)
    est = estimate_module(model, [x], loss_fn=lambda out: nn.SoftmaxLoss()(out, y),
                          zero_stage=ZERO[strategy], dp=p)
    sizes = [int(np.prod(q.shape)) for q in model.parameters()]
    psi = sum(sizes)
    if strategy in ("ddp", "zero1", "zero2", "single"):
        cs = needle_collectives(sizes, 4, "ddp" if strategy == "single" else strategy, p)
    else:  # FSDP's units: the model's children that hold parameters
        cs = needle_fsdp_collectives([(sum(int(q.size) for q in m.parameters()),
                                       len(m.parameters())) for m in model.modules
                                      if m.parameters()], 4, p)
    extra = needle_buffer_bytes(sizes, 4, strategy, p)
    if strategy == "zero3":
        extra = fsdp_buffer_bytes(_fsdp_spans(model, x, y), p)
    return est.total + extra, step_bytes(cs), 6.0 * psi * 32, cs


def _fsdp_spans(model: Any, x: Any, y: Any) -> List[Any]:
    """FSDP's units (the model's children with parameters) and their spans in backward."""
    outputs: Dict[int, Any] = {}
    units = [m for m in model.modules if m.parameters()]
    for m in units:
        def run(*a: Any, _m: Any = m, _f: Any = m.forward) -> Any:
            outputs[id(_m)] = _f(*a)
            return outputs[id(_m)]
        m.forward = run
    loss = nn.SoftmaxLoss()(model(x), y)
    return fsdp_unit_spans(loss, [(outputs[id(m)], m.parameters()) for m in units])


def _lm_spec(tp: int = 1) -> Tuple[ModelSpec, int]:
    from apps import model_parallel_strategies as mps
    # the worker pads the vocabulary to a multiple of its tp (Megatron's rule)
    vocab = mps.batches(SimpleNamespace(chars=50_000, seq_len=32, batch=16), tp)[1]
    return ModelSpec(4, 64, 4, 32, vocab).check(), vocab


def lm_layout(strategy: str, p: int) -> Layout:
    """The layout plan_worker.py runs: tp over all, pp over all (4 microbatches), 3d 2 x 2."""
    if strategy in ("tp", "single_lm"):
        return Layout(tp=p if strategy == "tp" else 1, microbatch=16)
    if strategy == "pp":
        return Layout(pp=p, microbatch=4)
    return Layout(dp=2, pp=2, microbatch=2)


def _lm_model(comm: Any, vocab: int) -> Any:
    """The character transformer of plan_worker.py, its tensor-parallel shard on ``comm``."""
    from apps import model_parallel_strategies as mps
    args = SimpleNamespace(d_model=64, heads=4, layers=4, seq_len=32)
    np.random.seed(0)
    return nn.Sequential(*mps.char_transformer(args, vocab, comm))


def _lm_loss(comm: Any, b: int) -> Any:
    from apps import model_parallel_strategies as mps
    y = ndl.Tensor(np.zeros(b * 32, dtype=np.int64), dtype="int64", requires_grad=False)
    return lambda out: mps._loss_fn(comm)(out, y)


def _ops(out: Any) -> int:
    """Ops in ``out``'s forward graph (each one Python dispatch and at least one NumPy call)."""
    return sum(n.op is not None for n in find_topo_sort([out]))


def _tp_rank_memory(comm: Any, vocab: int, b: int = 16) -> Tuple[float, float, int]:
    """(peak, forward graph bytes, forward ops) of this rank's shard on a batch of b:
    estimate_module of its own parameters and graph (the replicated residual stream and norms
    t does not divide)."""
    ids = ndl.Tensor(np.zeros((b, 32)), dtype="int64", requires_grad=False)
    model, loss = _lm_model(comm, vocab), _lm_loss(comm, b)
    est = estimate_module(model, [ids], loss_fn=loss)
    return est.total, est["activations"], _ops(loss(model(ids)))


def _stage_memory(comm: Any, vocab: int, lay: Layout) -> List[Tuple[float, float, int]]:
    """Per pipeline stage, (peak, one microbatch's graph bytes, its forward ops): its model
    states + the microbatches 1F1B keeps in flight (``in_flight_microbatches``), each its
    graph and its received input, + one backward's transient."""
    from needle.parallel.pipeline.partition import partition
    b, m = lay.microbatch, 16 // (lay.dp * lay.microbatch)
    stages = partition(_lm_model(comm, vocab), lay.pp)
    out = []
    for r, stage in enumerate(stages):
        if r == 0:
            x = ndl.Tensor(np.zeros((b, 32)), dtype="int64", requires_grad=False)
        else:
            x = ndl.Tensor(np.zeros((b, 32, 64), np.float32), requires_grad=True)
        loss = _lm_loss(comm, b) if r == lay.pp - 1 else None
        est = estimate_module(stage, [x], loss_fn=loss)
        held = est["activations"] + (x.numpy().nbytes if r > 0 else 0)
        n = in_flight_microbatches("1f1b", lay.pp, m, r)
        y = stage(x)
        out.append((est.model_states + n * held + est["backward_transient"],
                    est["activations"], _ops(loss(y) if loss else y)))
    return out


def _lm_memory(lay: Layout, vocab: int) -> List[Tuple[float, float, int]]:
    """Per rank (tp: each shard) or per stage (pp, 3d): (peak, graph bytes, forward ops)."""
    if lay.pp == 1:
        return virtual.run(lay.tp, _tp_rank_memory, vocab)
    return virtual.run(1, _stage_memory, vocab, lay)[0]


def lm_collectives(spec: ModelSpec, lay: Layout, setup: Setup) -> List[Any]:
    """needle's own TP / PP counts where the layout is pure TP or PP, else the textbook's."""
    m = setup.batch // (lay.dp * lay.microbatch)
    if lay.tp > 1 and lay.gpus == lay.tp:
        return needle_tp_collectives(spec.layers, lay.microbatch, spec.seq, spec.hidden,
                                     lay.tp, m)
    if lay.pp > 1 and lay.gpus == lay.pp:
        return needle_pp_collectives(lay.microbatch, spec.seq, spec.hidden, lay.pp, m)
    if lay.pp > 1 and lay.gpus == lay.pp * lay.dp:
        return _3d_collectives(spec, lay, m)
    return layout_collectives(spec, lay, setup)


def _3d_collectives(spec: ModelSpec, lay: Layout, m: int) -> List[Any]:
    """plan_worker's 3D step on its busiest stage: that stage's activation / gradient sends,
    the loss broadcast if it is the root (the last stage), and one dp allreduce per gradient."""
    sizes = virtual.run(1, _stage_sizes, _lm_spec(lay.tp)[1], lay.pp)[0]
    sbh = lay.microbatch * spec.seq * spec.hidden
    per_stage = []
    for r, stage in enumerate(sizes):
        cs = [Collective("send", "pp", lay.pp, sbh, 4, m * ((r < lay.pp - 1) + (r > 0)))]
        cs += [Collective("broadcast", "pp", lay.pp, 1, 8, 1)] if r == lay.pp - 1 else []
        per_stage.append(cs + [Collective("allreduce", "dp", lay.dp, n, 4, 1) for n in stage])
    return max(per_stage, key=step_bytes)


def _stage_sizes(comm: Any, vocab: int, pp: int) -> List[List[int]]:
    """Per pipeline stage of the char transformer, the sizes of the parameters that get a
    gradient (the worker allreduces only those), from one forward and backward of it."""
    from needle.parallel.pipeline.partition import partition
    out = []
    for r, stage in enumerate(partition(_lm_model(comm, vocab), pp)):
        if r == 0:
            x = ndl.Tensor(np.zeros((2, 32)), dtype="int64", requires_grad=False)
        else:
            x = ndl.Tensor(np.zeros((2, 32, 64), np.float32), requires_grad=True)
        y = stage(x)
        (_lm_loss(comm, 2)(y) if r == pp - 1 else y.sum()).backward(create_graph=False)
        out.append([int(q.size) for q in stage.parameters() if q.grad is not None])
    return out


class StepCost(NamedTuple):
    """needle's one-rank step time as ``per_op`` x forward ops + ``per_byte`` x forward graph
    bytes (backward included in both), fitted from two batch sizes (``fit_step_cost``)."""

    per_op: float
    per_byte: float

    def seconds(self, ops: float, nbytes: float, share: float = 1.0) -> float:
        """Forward + backward seconds of a graph of ``ops`` ops writing ``nbytes``."""
        return (self.per_op * ops + self.per_byte * nbytes) / share


def fit_step_cost(t_big: float, t_small: float) -> StepCost:
    """The one-rank char transformer's step at batch 16 (t_big) and 4 (t_small) seconds: the
    same ops, 4x fewer bytes, so the difference is the per-byte cost and the rest per op."""
    (_, a_big, ops), (_, a_small, _) = _full_graph(16), _full_graph(4)
    per_byte = max(t_big - t_small, 0.0) / (a_big - a_small)
    return StepCost(max(t_big - per_byte * a_big, 0.0) / ops, per_byte)


@lru_cache(maxsize=2)
def _full_graph(b: int) -> Tuple[float, float, int]:
    """(peak, forward graph bytes, forward ops) of the whole char transformer, batch b."""
    return virtual.run(1, _tp_rank_memory, _lm_spec(1)[1], b)[0]


def predict_lm(strategy: str, p: int, cluster: ClusterSpec, cost: StepCost
               ) -> Tuple[float, float, float, Any]:
    """(peak bytes, bytes per step, seconds) for tp / pp / 3d.

    Compute is ``cost`` applied to the rank's own forward graph (per microbatch for a pipeline
    stage) at its share of the cores: at hidden 64 needle's step is bound by per-op overhead
    and its NumPy ops' memory traffic, not by GEMM FLOPs (the one-rank step runs at ~3% of
    numpy's GEMM rate). A TP rank runs every op of the model (the shards are narrower, the
    residual stream, norms and embeddings whole: 0.68 of the bytes at t = 2, not 1/2); a
    stage runs its ops once per microbatch, however small. Backward is twice the forward; TP
    allreduces are added (no overlap); pipelines go through the schedule simulator with the
    busiest stage's times.
    """
    lay = lm_layout(strategy, p)
    spec, vocab = _lm_spec(lay.tp)
    cs = lm_collectives(spec, lay, Setup(16, "fp32", "adam"))
    m = 16 // (lay.dp * lay.microbatch)
    ranks = _lm_memory(lay, vocab)
    work = max(cost.seconds(ops, a, cluster.efficiency) for _, a, ops in ranks)
    f, b = work / 3, 2 * work / 3   # per microbatch for a stage, the whole step for TP
    tp = sum(comm_seconds(c, cluster, lay) for c in cs if c.group == "tp") / m
    p2p = sum(comm_seconds(c, cluster, lay) / c.calls for c in cs if c.name == "send")
    dp = sum(comm_seconds(c, cluster, lay) for c in cs if c.group == "dp")
    if lay.pp == 1:
        t = f + b + tp * m + dp
    else:
        t = pipeline_seconds("1f1b", lay.pp, m, f + tp / 2, b + tp / 2, p2p) + dp
    return max(r[0] for r in ranks), step_bytes(cs), t, lay


def _here(rate: float, ab: Dict[str, float], factor: float, p: int) -> ClusterSpec:
    """This machine as the planner sees it: ``rate`` FLOP/s per rank, the fitted alpha, beta,
    and efficiency 1 / ``factor``, the measured slowdown of synchronised work at p ranks
    (``core_sharing``: 1.0 up to the cores, 2.1-2.6 for 4 ranks on 2 cores, where cores / p
    would say 2)."""
    return ClusterSpec(1, p, 1e12, {"fp32": rate, "mixed": rate}, ab["alpha"], ab["beta"],
                       ab["alpha"], ab["beta"], efficiency=1.0 / factor, name="here")


def _median_ref(refs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One reference from a block's rounds: the median of each step time, with its spread."""
    out = {k: _median(refs, k) for k in ("step_s", "gemm_flops", "sharing") if k in refs[0]}
    out["spread"] = _spread(refs, "step_s")
    if "small" in refs[0]:
        out["small"] = _median_ref([r["small"] for r in refs])
    return out


def _median(runs: List[Dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def _spread(runs: List[Dict[str, Any]], key: str) -> float:
    """(max - min) / median of ``key`` over the rounds: the run-to-run noise."""
    xs = [r[key] for r in runs]
    return float((max(xs) - min(xs)) / np.median(xs))


def _predict_time(s: str, p: int, ab: Dict[str, float], ref: Dict[str, Any], factor: float
                  ) -> Tuple[float, float, float]:
    """(peak, bytes per step, seconds) predicted for s at p ranks from the one-rank ``ref``
    (the strategy's own for a data-parallel s, the char transformer's for the others)."""
    if s in DP:
        peak, nbytes, flops, cs = predict_dp(s, p)
        rate = flops / ref["step_s"]  # the same per-rank batch as the reference
        cl = _here(rate, ab, factor, p)
        t = flops / (rate * cl.efficiency) + sum(comm_seconds(c, cl, Layout(dp=p)) for c in cs)
        return peak, nbytes, t
    cost = fit_step_cost(ref["step_s"], ref["small"]["step_s"])
    peak, nbytes, t, _ = predict_lm(s, p, _here(1.0, ab, factor, p), cost)
    return peak, nbytes, t


def _row(s: str, p: int, meas: List[Dict[str, Any]], ab: Dict[str, float],
         ref: Dict[str, Any], factor: float) -> Dict[str, Any]:
    """The figures of s at p ranks: its rounds' median step (and spread) against the
    prediction from the rounds' median one-rank reference."""
    peak, nbytes, t = _predict_time(s, p, ab, ref, factor)
    return {"strategy": s, "ranks": p, "peak_measured": max(max(m["peak"]) for m in meas),
            "peak_predicted": peak, "bytes_measured": max(max(m["bytes"]) for m in meas),
            "bytes_predicted": nbytes, "step_s_measured": _median(meas, "step_s"),
            "step_s_spread": _spread(meas, "step_s"), "step_s_rounds": [m["step_s"] for m in meas],
            "step_s_predicted": t, "step_s_one_rank": ref["step_s"],
            "one_rank_spread": ref["spread"], "core_sharing": factor,
            "gemm_ratio": _median(meas, "gemm_flops") / ref["gemm_flops"]}


def _references(a: Any, threads: int, p: int) -> Dict[str, Dict[str, Any]]:
    """One round of one-rank references: each data-parallel strategy's own step (its
    framework time, ZeRO's flattening, shard copies, the optimizer on flat shards, which
    neither FLOPs nor the alpha-beta model see, is in it), and the char transformer's at
    batch 16 and 4, with the BLAS threads each rank of the runs gets; and the slowdown of
    synchronised synthetic work at p ranks (``core_sharing``)."""
    curve = measure_core_sharing(p, threads)
    refs = {"sharing": {"step_s": sharing_factor(curve), "curve": curve}}
    refs.update({name: run_worker(name, 1, a.steps, a.timeout, threads)
                 for name in DP + ("tp",)})
    refs["lm"] = refs.pop("tp")
    refs["lm"]["small"] = run_worker("tp", 1, a.steps, a.timeout, threads, ["--lm-batch", "4"])
    return refs


def _block(p: int, a: Any, threads: int) -> Tuple[Dict[str, Any], Dict[str, List[Any]]]:
    """``a.reps`` rounds, each the one-rank references then every strategy at p ranks (so
    a row and its reference alternate in time, A B A B, as the load drifts); the median
    reference per model and every round's run per strategy."""
    strategies = [s for s in DP + MP if s != "3d" or p == 4]
    refs: List[Dict[str, Any]] = []
    meas: Dict[str, List[Any]] = {s: [] for s in strategies}
    for _ in range(a.reps):
        refs.append(_references(a, threads, p))
        for s in strategies:
            meas[s].append(run_worker(s, p, a.steps, a.timeout))
    return {k: _median_ref([r[k] for r in refs]) for k in refs[0]}, meas


def _print_block(p: int, ref: Dict[str, Any], rows: List[Dict[str, Any]]) -> None:
    lm, sh = ref["lm"], ref["sharing"]
    print(f"{p}-rank block: synchronised work {sh['step_s']:.2f}x slower than at one rank "
          f"(core_sharing, median of the rounds, spread {sh['spread']:.0%}; cores / p would "
          f"say {max(1.0, p / (os.cpu_count() or 1)):.2f}x)")
    c = fit_step_cost(lm["step_s"], lm["small"]["step_s"])
    print(f"{p}-rank block: one-rank char transformer {lm['step_s'] * 1e3:.1f} ms"
          f" (batch 16, spread {lm['spread']:.0%}), {lm['small']['step_s'] * 1e3:.1f} ms"
          f" (batch 4): {c.per_op * 1e6:.1f} us per forward op, {c.per_byte * 1e9:.2f} ns per"
          " graph byte (forward + backward)")
    for r in rows:
        print(f"{r['strategy']:<8}{p:>6}{r['peak_measured'] / 1e6:>11.2f}"
              f"{r['peak_predicted'] / 1e6:>7.2f}{r['peak_predicted'] / r['peak_measured']:>7.2f}"
              f"{r['bytes_measured']:>12,.0f}{r['bytes_predicted']:>12,.0f}"
              f"{r['bytes_predicted'] / max(r['bytes_measured'], 1):>7.3f}"
              f"{r['step_s_measured'] * 1e3:>10.1f}{r['step_s_spread']:>8.0%}"
              f"{r['step_s_predicted'] * 1e3:>8.1f}"
              f"{r['step_s_predicted'] / r['step_s_measured']:>7.2f}"
              f"{r['step_s_one_rank'] * 1e3:>8.1f}{r['one_rank_spread']:>8.0%}"
              f"{r['gemm_ratio']:>9.2f}", flush=True)


def main() -> None:
    """Measure, predict, print the table and the rankings."""
    ap = cli.Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=cli.count_type(lo=1), nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=cli.count_type(lo=1), default=6,
                    help="timed steps per run (after warm-up)")
    ap.add_argument("--reps", type=cli.count_type(lo=1), default=3,
                    help="rounds per rank count: references, then every strategy")
    ap.add_argument("--timeout", type=cli.positive_type(), default=240)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    load = os.getloadavg()
    # alpha, beta with p ranks running: beyond the cores, a message waits for its receiver to
    # be scheduled (the idle ranks poll), which the 2-rank fit does not see
    abs_ = {p: measure_alpha_beta(p) for p in a.ranks}
    print(f"load average {load[0]:.1f} on {os.cpu_count()} cores; ping-pong alpha, beta: "
          + ", ".join(f"{p} ranks {ab['alpha'] * 1e6:.1f} us, {1 / ab['beta'] / 1e9:.2f} GB/s"
                      for p, ab in abs_.items()))
    # The one-rank reference runs with the BLAS threads each rank of the runs gets
    # (parallel.threads: cores // ranks, 1 here), not the cores-many a lone process starts: two
    # OpenBLAS threads on these small matmuls made a 1-rank step 10x slower than one thread.
    ref_threads = threads_per_rank(os.cpu_count() or 1, min(a.ranks))
    print(f"{a.reps} rounds per rank count, each {a.steps} timed steps after 2 warm-up steps;"
          " step ms: the median of the rounds, spread (max - min) / median")
    print(f"{'strategy':<8}{'ranks':>6}{'peak MB':>11}{'pred':>7}{'ratio':>7}{'bytes/step':>12}"
          f"{'pred':>12}{'ratio':>7}{'step ms':>10}{'spread':>8}{'pred':>8}{'ratio':>7}"
          f"{'1-rank':>8}{'spread':>8}{'GEMM N/1':>9}")
    rows: List[Dict[str, Any]] = []
    for p in a.ranks:
        ref, meas = _block(p, a, ref_threads)
        factor = ref["sharing"]["step_s"]
        block = [_row(s, p, ms, abs_[p], ref[s if s in DP else "lm"], factor)
                 for s, ms in meas.items()]
        _print_block(p, ref, block)
        rows += block
    _rankings(rows)
    within = sum(abs(r["step_s_predicted"] / r["step_s_measured"] - 1) <= 0.25 for r in rows)
    print(f"step time within 25%: {within} of {len(rows)}")
    load_end = os.getloadavg()
    print(f"load average at the end {load_end[0]:.1f} (1 min), {load_end[1]:.1f} (5 min)")
    if a.json:
        Path(a.json).write_text(json.dumps({"load": load, "load_end": load_end,
                                            "reps": a.reps, "steps": a.steps,
                                            "alpha_beta": abs_, "rows": rows}, indent=1))


def _rankings(rows: List[Dict[str, Any]]) -> None:
    """Per rank count and model family: the order by predicted vs by measured step time."""
    for p in sorted({r["ranks"] for r in rows}):
        for fam in (DP, MP):
            rs = [r for r in rows if r["ranks"] == p and r["strategy"] in fam]
            if len(rs) < 2:
                continue
            pred = [r["strategy"] for r in sorted(rs, key=lambda r: r["step_s_predicted"])]
            meas = [r["strategy"] for r in sorted(rs, key=lambda r: r["step_s_measured"])]
            pairs = [(i, j) for i in range(len(rs)) for j in range(i + 1, len(rs))]
            agree = sum((rs[i]["step_s_predicted"] < rs[j]["step_s_predicted"])
                        == (rs[i]["step_s_measured"] < rs[j]["step_s_measured"])
                        for i, j in pairs)
            print(f"{p} ranks: predicted order {pred}, measured {meas}: "
                  f"{agree}/{len(pairs)} pairs agree")


if __name__ == "__main__":
    main()
