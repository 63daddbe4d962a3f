"""Ranks agreeing on a strategy's settings before the first step.

Ranks built with different settings (bucket size, ZeRO stage, hyperparameters...) would fail
far from the cause or train on silently. ``agree(comm, "DistributedDataParallel", {...})``
allgathers a fixed-size JSON record of each rank's settings; if any differ, every rank raises
the same ``ValueError`` naming each setting that differs and every rank's value.
"""
import json
from collections import abc
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .protocol import Comm

RECORD = 2048  # bytes per rank: settings are a few numbers and names


def optimizer_settings(spec: Tuple[Any, Dict[str, Any]],
                       prefix: str = "optimizer") -> Dict[str, Any]:
    """``(optimizer class, kwargs)`` as settings: its name and each ``optimizer.<kwarg>``."""
    cls, kwargs = spec
    out: Dict[str, Any] = {prefix: getattr(cls, "__name__", str(cls))}
    out.update({f"{prefix}.{k}": v for k, v in sorted(kwargs.items())})
    return out


def _plain(v: Any) -> Any:
    """A JSON-friendly scalar (or tuple of scalars) version of ``v``, else None."""
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (np.number, np.bool_, np.str_)):
        return v.item()
    if isinstance(v, (tuple, list)) and all(_plain(x) is not None and not isinstance(x, (
            tuple, list)) for x in v):
        return [_plain(x) for x in v]
    return None


def _record(settings: Dict[str, Any], who: str) -> np.ndarray:
    values = {k: _plain(v) for k, v in settings.items()}
    raw = json.dumps({k: repr(settings[k]) if v is None and settings[k] is not None else v
                      for k, v in values.items()}, sort_keys=True).encode()
    if len(raw) > RECORD:
        raise ValueError(f"{who}: settings fingerprint too long ({len(raw)} > {RECORD} bytes)")
    out = np.zeros(RECORD, dtype=np.uint8)
    out[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out


def agree(comm: Comm, who: str, settings: Dict[str, Any]) -> None:
    """Collective: raise on every rank if the ranks' ``settings`` differ, naming them."""
    if comm.size == 1:
        return
    every = comm.allgather(_record(settings, who)).reshape(comm.size, RECORD)
    if (every == every[0]).all():
        return
    per_rank = [json.loads(bytes(row).rstrip(b"\0").decode()) for row in every]
    lines = []
    for k in sorted({k for s in per_rank for k in s}):
        values = [s.get(k, "<not set>") for s in per_rank]
        if any(v != values[0] for v in values):
            lines.append(f"{k}: " + by_rank([repr(v) for v in values]))
    raise ValueError(f"{who} (rank {comm.rank}): ranks disagree on their settings: "
                     + "; ".join(lines))


def by_rank(values: Sequence[Any]) -> str:
    """"rank 0 has 4, ranks [1, 2] have 5": each distinct value with the ranks holding it."""
    if isinstance(values, (str, bytes)) or not isinstance(values, abc.Sequence):
        raise TypeError(f"by_rank: values must be a sequence (one per rank), got "
                        f"{type(values).__name__}")
    groups: Dict[str, List[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(str(v), []).append(r)
    return ", ".join(f"rank {rs[0]} has {v}" if len(rs) == 1 else f"ranks {rs} have {v}"
                     for v, rs in groups.items())
