"""The CPU backend's optional ``adam_update`` primitive: ``adam.cu``'s step as a numba loop, one
pass where composed ops make ten (benchmarks/README.md); offered where numba is installed."""
import functools
import importlib.util
from typing import Any, Callable

AVAILABLE = importlib.util.find_spec("numba") is not None


@functools.lru_cache(maxsize=None)
def _kernel() -> Callable:
    from .adam_cpu_kernel import adam_step  # imports numba: on first use only
    return adam_step


def adam_update(p: Any, g: Any, m: Any, v: Any, lr: float, beta1: float, beta2: float,
                eps: float, weight_decay: float, step: int, decoupled: bool) -> None:
    """One Adam/AdamW step in place on p (gradient g of p's dtype), m and v (accumulators)."""
    acc = m.array.dtype.type
    consts = (acc(lr), acc(weight_decay), acc(beta1), acc(1 - beta1), acc(beta2),
              acc(1 - beta2), acc(1 - beta1 ** step), acc(1 - beta2 ** step), acc(eps))
    if p.array.dtype == m.array.dtype:
        _kernel()(p.array, g.array, m.array, v.array, *consts, bool(decoupled))
        return
    w = p.array.astype(m.array.dtype)  # float16/bfloat16: step a float32 copy, round back
    _kernel()(w, g.array.astype(w.dtype), m.array, v.array, *consts, bool(decoupled))
    p.array[:] = w.astype(p.array.dtype)
