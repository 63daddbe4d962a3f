"""Checking each rank's own arguments against its group before any message moves.

``metadata.py`` checks that all ranks *agree*; this module, what one rank sees alone (a root
outside the group would make ``broadcast`` return zeros, silently). Every error names the
argument, its value, the rank and the call.
"""
import numbers
import os
from typing import Any, Optional

import numpy as np

from .... import numbers as strict
from ..algorithms.reference import UFUNCS

# dtypes a reduction can run on: numbers and bool (never objects, strings or records)
_REDUCIBLE = "biufc"


def _where(call: str, name: str, value: Any, rank: int, size: int) -> str:
    return f"{call}({name}={value!r}) on rank {rank} of {size}"


def check_rank(call: str, name: str, value: Any, rank: int, size: int) -> int:
    """``value`` as an int rank of a group of ``size``, else a ``ValueError`` naming it."""
    n = check_int(call, name, value, rank, size, "an int rank")
    if not 0 <= n < size:
        raise ValueError(f"{_where(call, name, value, rank, size)}: {name} must be a rank of "
                         f"this communicator, 0..{size - 1}")
    return n


def check_tag(call: str, tag: Any, tag_ub: int, rank: int, size: int,
              any_tag: Optional[int] = -1) -> int:
    """``tag`` in ``[0, tag_ub)`` (or ``any_tag`` where a receive allows it)."""
    n = check_int(call, "tag", tag, rank, size)
    if n != any_tag and not 0 <= n < tag_ub:
        raise ValueError(f"{_where(call, 'tag', tag, rank, size)}: tag must be in "
                         f"[0, {tag_ub})")
    return n


def check_op(call: str, op: Any, dtype: Any, rank: int, size: int) -> None:
    """``op`` is a known reduction and ``dtype`` can be reduced with it."""
    if not isinstance(op, str) or op not in UFUNCS:
        raise ValueError(f"{_where(call, 'op', op, rank, size)}: unknown op; choose from "
                         f"{sorted(UFUNCS)}")
    check_dtype(call, dtype, rank, size, reduce=True)
    if op == "avg" and np.dtype(dtype) == np.bool_:
        raise ValueError(f"{_where(call, 'op', op, rank, size)}: op='avg' is not defined for "
                         "bool arrays")


def check_dtype(call: str, dtype: Any, rank: int, size: int, reduce: bool = False) -> None:
    """A dtype that can travel as raw bytes (and, with ``reduce``, be reduced)."""
    dt = np.dtype(dtype)
    # objects are pointers (meaningless in another process); strings, records, datetimes: no sum
    if dt.hasobject or reduce and dt.kind not in _REDUCIBLE and dt.name != "bfloat16":
        raise TypeError(f"{call} on rank {rank} of {size}: arrays of dtype {dt} cannot be "
                        f"{'reduced' if reduce else 'sent'}")


def check_recv_buffer(call: str, out: Any, rank: int, size: int) -> None:
    """``out=`` of a receive: a writeable C-contiguous numpy array (messages land in it as
    raw bytes), else an error naming it."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{call} on rank {rank} of {size}: out must be a numpy array, not "
                        f"{type(out).__name__}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        what = "strided" if out.flags.writeable else "read-only"
        raise ValueError(f"{call} on rank {rank} of {size}: out must be a writeable C-contiguous "
                         f"numpy array, not a {what} {out.dtype}{out.shape} array")


def check_int(call: str, name: str, value: Any, rank: int, size: int, what: str = "an int"
              ) -> int:
    """``value`` as an int (a split's color or key), else a ``TypeError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{_where(call, name, value, rank, size)}: {name} must be {what}, not "
                        f"{type(value).__name__}")
    return int(value)


def env_bytes(name: str, default: int, minimum: int = 0) -> int:
    """An int of at least ``minimum`` bytes from environment variable ``name`` (or ``default``)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = strict.count(raw, name, lo=None)
    except strict.NumberError:
        raise ValueError(f"{name} must be a number of bytes (ASCII digits), got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum} bytes, got {raw!r}")
    return value


# A longer deadline is no deadline (11.6 days), and sleeps and lock waits overflow near 1e10 s.
MAX_TIMEOUT = 1e6


def check_timeout(timeout: Any, env: str = "NEEDLE_COMM_TIMEOUT") -> float:
    """The communicator's timeout in seconds: a finite number in (0, MAX_TIMEOUT] (``env``
    names its source; nan or inf would turn the deadline off: a dead rank would hang the rest)."""
    try:
        return strict.real(timeout, "", lo=0, hi=MAX_TIMEOUT, lo_open=True)
    except strict.NumberError:
        raise ValueError(f"the communicator timeout must be a finite number of seconds in "
                         f"(0, {MAX_TIMEOUT:g}], got {timeout!r} ({env})") from None
