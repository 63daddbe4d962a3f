"""Ranks agreeing on a parallel layer's per-call inputs (targets, ids, shard widths, batches),
which give a wrong answer, not an error, when the ranks' differ (docs/reliability.md, "Inputs").

Each rank reduces its input to a few integers (a width, a CRC-32) that ride in the ``context``
of a collective the layer makes anyway (``pack``: the argument check compares it, no message)
or are compared by one allgather (``agree_inputs``); ``disagreement`` re-raises a collective's
``CallMismatchError`` naming the layer and each rank's values.
"""
import contextlib
import operator
import zlib
from typing import Any, Dict, Iterator, List, Sequence

import numpy as np

from .comm.agree import by_rank
from .comm.protocol import Comm
from .inputs import host_array

__all__ = ["checksum", "pack", "unpack", "by_rank", "disagreement", "agree_inputs"]

CONTEXT_BITS = 62  # a collective's context: a non-negative int64 the argument check compares


def checksum(values: Any) -> int:
    """CRC-32 of ``values``' shape, dtype and bytes: arrays that differ almost surely differ."""
    a = np.ascontiguousarray(host_array(values))
    if a.dtype.kind == "O":  # bytes of references: differ on every rank
        raise TypeError(f"checksum: expected an array of numbers, got {type(values).__name__}")
    head = zlib.crc32(repr((a.shape, a.dtype.str)).encode())
    return zlib.crc32(a.reshape(-1).view(np.uint8).data, head)


def pack(values: Sequence[int], bits: Sequence[int]) -> int:
    """Non-negative ints side by side in one context (each kept modulo 2**bits)."""
    if len(values) != len(bits):  # zip would drop the extra values unchecked
        raise ValueError(f"pack: {len(values)} values but {len(bits)} widths")
    bits = _widths(bits, "pack")
    if sum(bits) > CONTEXT_BITS:
        raise ValueError(f"pack: {sum(bits)} bits do not fit a context of {CONTEXT_BITS}")
    out, shift = 0, 0
    for v, b in zip(values, bits):
        out |= (_whole(v, "pack: a value") % (1 << b)) << shift
        shift += b
    return out


def unpack(context: int, bits: Sequence[int]) -> List[int]:
    """The ints ``pack`` put in ``context``."""
    context, bits = _whole(context, "unpack: the context"), _widths(bits, "unpack")
    if context < 0:
        raise ValueError(f"unpack: a context is >= 0, got {context}")
    out = []
    for b in bits:
        out.append(context % (1 << b))
        context >>= b
    return out


def _whole(v: Any, what: str) -> int:
    """``v`` as an int (an int or a NumPy integer), else TypeError: int(1.5) would be 1."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(v).__name__} {v!r}") from None


def _widths(bits: Sequence[Any], who: str) -> List[int]:
    """``bits`` as ints >= 1 (a width of 0 packs nothing)."""
    out = [_whole(b, f"{who}: a width in bits") for b in bits]
    if min(out, default=1) < 1:
        raise ValueError(f"{who}: widths in bits must be >= 1, got {out}")
    return out


def _heading(comm: Comm, what: str) -> str:
    return f"{what} (rank {comm.rank} of {comm.size}): ranks disagree on "


def _differing(names: Sequence[str], rows: Sequence[Sequence[int]]) -> List[str]:
    """``name: rank 0 has a, rank 1 has b`` for each column of ``rows`` that differs (a
    checksum, named ``... (CRC-32)``, in hex)."""
    out = []
    for i, name in enumerate(names):
        col = [row[i] for row in rows]
        if any(v != col[0] for v in col):
            shown = [f"{v:#010x}" for v in col] if "CRC-32" in name else col
            out.append(f"{name}: {by_rank(shown)}")
    return out


@contextlib.contextmanager
def disagreement(comm: Comm, what: str, names: Sequence[str] = (),
                 bits: Sequence[int] = ()) -> Iterator[None]:
    """Re-raise a collective's argument mismatch inside as ``what``'s error, naming every
    rank's packed ``names`` when their contexts differ, else the calls' shapes and dtypes.
    The innermost layer names itself; an error already named passes through."""
    try:
        yield
    except ValueError as err:
        contexts = getattr(err, "contexts", None)
        if contexts is None or getattr(err, "named", False):
            raise  # not the communicator's argument check, or named by an inner layer
        lines = _differing(names, [unpack(c, bits) for c in contexts]) if names else []
        text = "; ".join(lines) or f"the input's shape or dtype: {err}"
        new = type(err)(_heading(comm, what) + text, contexts)
        new.named = True  # type: ignore[attr-defined]
        raise new from err


def agree_inputs(comm: Comm, what: str, fields: Dict[str, int], label: str) -> None:
    """Collective: raise on every rank if the ranks' ``fields`` differ, naming each rank's
    value. Costs one allgather of ``len(fields)`` int64 per rank (nothing on one rank)."""
    if not hasattr(comm, "allgather") or not hasattr(comm, "size"):
        raise TypeError(f"agree_inputs: comm must be a communicator, got {type(comm).__name__}")
    if not isinstance(fields, dict):
        raise TypeError(f"agree_inputs: fields must be a dict of name -> int, got "
                        f"{type(fields).__name__}")
    names = list(fields)
    row = [_whole(fields[n], f"{what}: input {n!r}") for n in names]  # 1.2 and 1.4: both 1
    if comm.size == 1:
        return
    mine = np.array([row], dtype=np.int64)   # (1, k)
    with disagreement(comm, what):
        every = comm.allgather(mine, label=label).reshape(comm.size, len(names))  # (p, k)
    lines = _differing(names, every.tolist())
    if lines:
        raise ValueError(_heading(comm, what) + "; ".join(lines))
