"""``python -m needle.memory`` (or ``python -m needle.estimate``): print a transformer's
training memory, term by term.

Example: ``python -m needle.memory --layers 24 --hidden 2048 --heads 16 --seq 2048
--vocab 50257 --batch 4 --precision mixed --optimizer adam --zero 1 --dp 8``.
"""
import sys
from typing import List, Optional

from ..cli import Parser
from .estimator import OPTIMIZERS, PRECISIONS, TransformerConfig, estimate_transformer


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the model description, print the estimate; exit status 2 on impossible configs."""
    ap = Parser(prog="python -m needle.estimate", description=__doc__)
    for name, default in (("layers", 12), ("hidden", 768), ("heads", 12), ("seq", 1024),
                          ("vocab", 50257), ("batch", 8)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--ffn-mult", type=int, default=4)
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--no-dropout", action="store_true")
    ap.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel degree Nd")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree t")
    ap.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree p")
    ap.add_argument("--sequence-parallel", action="store_true")
    args = ap.parse_args(argv)
    if args.zero and args.dp == 1:  # ZeRO shards over the data-parallel ranks
        ap.error(f"--zero {args.zero} shards the states over --dp ranks: give --dp > 1")
    if args.sequence_parallel and args.tp == 1:
        ap.error("--sequence-parallel splits the sequence over --tp ranks: give --tp > 1")
    cfg = TransformerConfig(args.layers, args.hidden, args.heads, args.seq, args.vocab,
                            args.batch, args.ffn_mult)
    try:
        est = estimate_transformer(cfg, precision=args.precision, optimizer=args.optimizer,
                                   checkpointing=args.checkpointing, zero_stage=args.zero,
                                   dp=args.dp, tp=args.tp, pp=args.pp,
                                   sequence_parallel=args.sequence_parallel,
                                   dropout=not args.no_dropout)
    except ValueError as err:
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        return 2
    print(est.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
