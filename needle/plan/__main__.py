"""``python -m needle.plan``: rank the ways to train a model on a cluster (README has examples)."""
import argparse
import json
import sys
from collections import Counter
from dataclasses import replace
from typing import Any, List, Optional

from ..cli import Parser
from . import cluster as clusters
from . import model as models
from .gpu_memory import CATEGORIES
from .layout import OPTIMIZERS, PRECISIONS, Setup
from .predict import Prediction
from .rank import plan


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m needle.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--model", help=f"a preset: {', '.join(models.PRESETS)}")
    ap.add_argument("--params", type=float, help="only a parameter count (model states only)")
    for name in ("layers", "hidden", "heads", "seq", "vocab"):
        ap.add_argument("--" + name, type=int)
    ap.add_argument("--batch", type=int, default=None, help="global batch (sequences)")
    ap.add_argument("--microbatch", type=int, default=None, help="sequences per microbatch")
    ap.add_argument("--precision", choices=PRECISIONS + ("any",), default="mixed",
                    help="fp32, mixed (fp16/bf16 weights and grads + fp32 master), or any: both")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    ap.add_argument("--cluster", default="dgx-a100-80g",
                    help=f"{', '.join(clusters.PRESETS)} or 'here' (measured now)")
    ap.add_argument("--gpus", type=int, help="GPUs in all (a multiple of --gpus-per-node)")
    ap.add_argument("--gpus-per-node", type=int)
    ap.add_argument("--gpu-memory", type=float, help="GB per GPU")
    ap.add_argument("--efficiency", type=float, help="achieved / peak FLOP/s of the GEMMs")
    ap.add_argument("--top", type=int, default=None, help="how many of the best to print (5)")
    ap.add_argument("--all", action="store_true", help="every layout, not only the best")
    ap.add_argument("--json", action="store_true", help="a JSON list of layouts")
    return ap


def build_model(args: Any) -> models.ModelSpec:
    """The ModelSpec the flags describe (a preset with overrides, a shape, or --params)."""
    shape = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "vocab")
             if getattr(args, k) is not None}
    if args.model and args.params is not None:
        raise ValueError("give either --model or --params, not both")
    if args.model:
        return models.preset(args.model, **shape)
    if args.params is not None:
        if shape:
            raise ValueError("give either --params or the shape (--layers ...), not both")
        return models.ModelSpec(params=args.params, name="params").check()
    missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in shape]
    if missing:
        raise ValueError(f"describe the model: --model PRESET, --params N, or all of --layers "
                         f"--hidden --heads --seq --vocab (missing: {', '.join(missing)})")
    return models.ModelSpec(**shape).check()


def build_cluster(args: Any) -> clusters.ClusterSpec:
    """The ClusterSpec: a preset (or 'here', measured) resized by --gpus/--gpus-per-node."""
    if args.cluster == "here":
        base = clusters.measure_here(args.gpus or 2)
    else:
        base = clusters.preset(args.cluster)
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {args.gpus}")
    if args.gpus_per_node is not None:  # 0 is an answer (a wrong one), not "unset"
        gpn = args.gpus_per_node
    else:
        gpn = min(base.gpus_per_node, args.gpus) if args.gpus else base.gpus_per_node
    if gpn < 1:
        raise ValueError(f"gpus-per-node must be a positive integer, got {gpn}")
    gpus = args.gpus if args.gpus is not None else base.nodes * gpn
    if gpus % gpn:
        raise ValueError(f"gpus={gpus} must be a multiple of gpus-per-node={gpn}")
    over = {"nodes": gpus // gpn, "gpus_per_node": gpn}
    if args.gpu_memory is not None:
        over["gpu_memory"] = args.gpu_memory * 1e9
    if args.efficiency is not None:
        over["efficiency"] = args.efficiency
    return replace(base, **over).check()


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def _line(p: Prediction) -> str:
    m = p.memory
    mem = " ".join(f"{k[:5]}={_gb(m[k])}" for k in CATEGORIES if k in m)
    t = (f"step {p.step_seconds:.3g}s MFU {p.mfu:.1%} {p.tokens_per_s:,.0f} tok/s  "
         if p.step_seconds == p.step_seconds else "")
    return f"{p.layout.describe() + ' ' + p.precision:<64} {t}{_gb(m['total'])} GB [{mem}]"


def report(preds: List[Prediction], top: int, show_all: bool) -> str:
    """The human-readable table: the best few, then why not for the rest."""
    fit = [p for p in preds if p.fits]
    lines = [f"{len(fit)} of {len(preds)} layouts fit. Best first:"]
    lines += [f"{i + 1:>3}. {_line(p)}" for i, p in enumerate(fit[:top if not show_all else None])]
    rest = [p for p in preds if not p.fits]
    if show_all:
        lines += ["Not possible:"] + [f"  - {p.layout.describe()}: {p.why_not}" for p in rest]
    elif rest:
        why = Counter((p.why_not or "").split(":")[0] for p in rest)
        lines.append("Not possible (--all lists each): " + "; ".join(
            f"{n} x {w}" for w, n in why.most_common()))
        lines += [f"  e.g. {p.layout.describe()}: {p.why_not}" for p in rest[:3]]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Parse, plan, print; exit status 2 with the rule broken on bad input."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.top is not None and args.all:
        ap.error("give either --top N or --all, not both")
    if args.top is not None and args.top < 1:
        ap.error(f"--top must be at least 1, not {args.top}")
    top = 5 if args.top is None else args.top
    try:
        spec = build_model(args)
        cl = build_cluster(args)
        batch = args.batch if args.batch is not None else cl.gpus
        preds = plan(spec, Setup(batch, args.precision, args.optimizer), cl, args.microbatch)
    except (ValueError, FileNotFoundError) as err:  # --cluster here: no mpiexec
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        items = preds if args.all else [p for p in preds if p.fits][:top]
        print(json.dumps([p.to_dict() for p in items], indent=1, default=float))
    else:
        print(f"model {spec.name}: {spec.num_params:,.0f} parameters; cluster {cl.name}: "
              f"{cl.nodes} x {cl.gpus_per_node} GPUs of {cl.gpu_memory / 1e9:.0f} GB")
        print(report(preds, top, args.all))
        if spec.is_transformer:
            print(f"assumed: {cl.efficiency:.0%} of peak FLOP/s in the GEMMs; tp comm not "
                  f"overlapped; dp comm " + ("hidden behind backward when pp = 1"
                                             if cl.overlap else "not overlapped")
                  + " (needle/plan/predict.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
