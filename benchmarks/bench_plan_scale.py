"""The planner's time against the GPU count: ``needle.plan.rank.plan`` for one model at each
count (the CLI's defaults: dgx-a100-80g nodes of 8, global batch = GPUs), collectives priced in
closed form (``collective_sends.busiest``) and, up to ``--reference-up-to`` GPUs, summed rank
by rank as before (``rank_by_rank``); the caches are cleared before every run. Wall seconds,
the median of ``--repeats``; the two ways alternate, so a change of machine speed hits both.

    python benchmarks/bench_plan_scale.py [--gpus 1024 8192 65536 1000000] [--model llama-70b]
        [--params 7e9] [--repeats 3] [--reference-up-to 65536]
"""
import statistics
import time
from typing import Callable, List, Optional

from needle import cli
from needle.plan import bubble, cluster, collective_sends, comm_time
from needle.plan.layout import Setup
from needle.plan.model import ModelSpec, preset
from needle.plan.rank import plan


def _run(spec: ModelSpec, gpus: int, price: Callable) -> float:
    """Wall seconds of one plan with ``price`` as the planner's per-call sends."""
    for cached in (collective_sends.collective_steps, collective_sends.rank_by_rank,
                   bubble.makespan):
        cached.cache_clear()
    saved, comm_time.busiest = comm_time.busiest, price  # type: ignore[assignment]
    try:
        cl = cluster.preset("dgx-a100-80g", nodes=gpus // 8)
        t0 = time.perf_counter()
        preds = plan(spec, Setup(gpus), cl)
        seconds = time.perf_counter() - t0
    finally:
        comm_time.busiest = saved  # type: ignore[assignment]
    if not any(p.fits for p in preds):
        raise SystemExit(f"bench_plan_scale: no layout of {spec.name} fits {gpus} GPUs")
    return seconds


def _row(spec: ModelSpec, gpus: int, repeats: int, reference: bool) -> str:
    fast: List[float] = []
    slow: List[float] = []
    for _ in range(repeats):
        fast.append(_run(spec, gpus, collective_sends.busiest))
        if reference:
            slow.append(_run(spec, gpus, collective_sends.rank_by_rank))
    ref: Optional[float] = statistics.median(slow) if slow else None
    return (f"{spec.name:<10} {gpus:>10,} {statistics.median(fast):>12.3f}"
            f" {'-' if ref is None else f'{ref:.3f}':>14}")


def main() -> None:
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=cli.count_type(lo=8), nargs="+",
                        default=[1024, 8192, 65536, 1_000_000])
    parser.add_argument("--model", default="llama-70b", help="a preset; 'none': --params only")
    parser.add_argument("--params", type=cli.real_type(lo=1), default=7e9,
                        help="also a parameter count alone (0: not)")
    parser.add_argument("--repeats", type=cli.count_type(lo=1, hi=100), default=3)
    parser.add_argument("--reference-up-to", type=cli.count_type(lo=0), default=65536,
                        help="GPUs up to which the rank-by-rank sums run too")
    args = parser.parse_args()
    if any(g % 8 for g in args.gpus):
        parser.error(f"--gpus: each a multiple of 8 (nodes of 8 GPUs), got {args.gpus}")
    specs = [] if args.model == "none" else [preset(args.model)]
    if args.params:
        specs.append(ModelSpec(params=args.params, name="params").check())
    print(f"{'model':<10} {'GPUs':>10} {'closed form':>12} {'rank by rank':>14}  (s, median of "
          f"{args.repeats})")
    for spec in specs:
        for gpus in args.gpus:
            print(_row(spec, gpus, args.repeats, gpus <= args.reference_up_to), flush=True)


if __name__ == "__main__":
    main()
