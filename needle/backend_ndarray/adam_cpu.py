"""The CPU backend's optional ``multi_tensor_adam`` primitive: multi_tensor.cu's step as a numba
loop per tensor, one pass where the composed step (``Adam.step``) makes about ten
(benchmarks/README.md); offered where numba is installed. Not in the student release: it is
hw2.optim.adam's answer in a loop."""
import functools
import importlib.util
from typing import Any, Callable, Dict, Sequence

AVAILABLE = (importlib.util.find_spec("numba") is not None
             and importlib.util.find_spec(__package__ + ".adam_cpu_kernel") is not None)


@functools.lru_cache(maxsize=None)
def _kernel() -> Callable:
    from .adam_cpu_kernel import adam_step  # imports numba: on first use only
    return adam_step


def multi_tensor_adam(ps: Sequence[Any], gs: Sequence[Any], ms: Sequence[Any],
                      vs: Sequence[Any], slots: Sequence[int], steps: Any, hyper: Any,
                      cache: Dict[str, Any], decoupled: bool) -> None:
    """One Adam/AdamW step in place on every ``ps[k]`` (gradient ``gs[k]`` of its dtype, state
    ``ms[k]``, ``vs[k]`` in the accumulator dtype), the CUDA primitive's contract: ``steps``
    (int64) counts each tensor's steps at its slot (``steps[slots[k]] += 1`` here), ``hyper``
    holds [lr, b1, 1 - b1, b2, 1 - b2, eps, wd] (float64); ``cache`` is unused here."""
    lr, b1, omb1, b2, omb2, eps, wd = (float(h) for h in hyper.array[:7])
    for p, g, m, v, slot in zip(ps, gs, ms, vs, slots):
        steps.array[slot] += 1
        t = int(steps.array[slot])
        acc = m.array.dtype.type
        consts = (acc(lr), acc(wd), acc(b1), acc(omb1), acc(b2), acc(omb2), acc(1 - b1 ** t),
                  acc(1 - b2 ** t), acc(eps))
        if p.array.dtype == m.array.dtype:
            _kernel()(p.array, g.array, m.array, v.array, *consts, bool(decoupled))
            continue
        w = p.array.astype(m.array.dtype)  # float16/bfloat16: step a float32 copy, round back
        _kernel()(w, g.array.astype(w.dtype), m.array, v.array, *consts, bool(decoupled))
        p.array[:] = w.astype(p.array.dtype)
