"""A parallel layer's input checks: the serial layer's refusals, on every rank, before a message.

A bad input seen by one rank would otherwise hang the others in a collective, or pass silently
(an index no rank owns embeds to zero). Each error names the layer, this rank and the value.
"""
from typing import Any, Optional, Tuple

import numpy as np

from .comm.protocol import Comm

__all__ = ["on_rank", "host_array", "check_indices", "check_width", "check_device", "check_split"]


def on_rank(comm: Comm) -> str:
    """" on rank r of p", the suffix every parallel input error carries."""
    return f" on rank {comm.rank} of {comm.size}"


def host_array(values: Any) -> np.ndarray:
    """``values`` (Tensor, NDArray, array or list) as a NumPy array on the host."""
    return np.asarray(values.numpy() if hasattr(values, "numpy") else values)


def check_indices(values: Any, n: int, comm: Comm, what: str) -> np.ndarray:
    """``values`` as int64 after the serial checks (integer or whole-number dtype, all in
    [0, n)); a TypeError or ValueError naming ``what``, this rank and the first bad value."""
    idx = host_array(values)
    if idx.dtype.kind == "f":
        frac = np.flatnonzero(np.mod(idx, 1) != 0)
        if frac.size:
            pos = np.unravel_index(frac[0], idx.shape)
            raise ValueError(f"{what}{on_rank(comm)}: indices must be whole numbers, got "
                             f"{idx[pos]} at {tuple(int(i) for i in pos)}")
    elif idx.dtype.kind not in "iub":
        raise TypeError(f"{what}{on_rank(comm)}: indices must be integers, got dtype "
                        f"{idx.dtype}")
    idx = idx.astype(np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= n))
    if bad.size:
        pos = np.unravel_index(bad[0], idx.shape)
        raise ValueError(f"{what}{on_rank(comm)}: indices must lie in [0, {n}), got "
                         f"{idx[pos]} at {tuple(int(i) for i in pos)} ({bad.size} out of range)")
    return idx


def check_width(shape: Tuple[int, ...], width: int, comm: Comm, what: str,
                ndim: Optional[int] = None) -> None:
    """The last axis of ``shape`` is ``width`` (and, if given, ``shape`` has ``ndim`` axes)."""
    if not shape or shape[-1] != width or (ndim is not None and len(shape) != ndim):
        want = f"{ndim} axes, the last of {width}" if ndim else f"(..., {width})"
        raise ValueError(f"{what} got input of shape {tuple(shape)}{on_rank(comm)} "
                         f"(expects {want})")


def check_device(x: Any, weight: Any, comm: Comm, what: str) -> None:
    """``x`` lives on ``weight``'s device (the serial ops refuse two devices)."""
    if x.device != weight.device:
        raise ValueError(f"{what}{on_rank(comm)}: input on {x.device} but the weights on "
                         f"{weight.device}")


def check_split(shape: Tuple[int, ...], axis: int, comm: Comm, what: str,
                name: Optional[str] = None) -> None:
    """Axis ``axis`` of ``shape`` exists and splits into ``comm.size`` equal parts."""
    label = name or f"axis {axis}"
    if len(shape) <= axis or shape[axis] % comm.size:
        got = shape[axis] if len(shape) > axis else "missing"
        raise ValueError(f"{what}{on_rank(comm)}: {label} of input {tuple(shape)} ({got}) does "
                         f"not split into {comm.size} equal parts")
