"""``autocast``: run matmul/conv in float16 or bfloat16, precision-sensitive ops in float32.

Micikevicius et al., "Mixed Precision Training" (arXiv:1710.03740): products in half precision,
float32 master weights, float32 accumulation for reductions. Inside ``autocast(dtype)`` every
TensorOp call passes through ``policy(op, args)`` (the ``autograd._AUTOCAST_HOOK``), which
inserts ``Cast`` nodes into the graph, as torch.autocast does:

* ``LOW_PRECISION`` ops (MatMul, Conv): float32 inputs are cast to ``dtype``; so are their
  gradients, since backward runs the same ops on the cast (low-precision) inputs.
* ``FLOAT32`` ops (sums, log-sum-exp, (log-)softmax, exp, log, powers: the reductions, softmax
  and normalisations): low-precision inputs are cast up to float32.
* elementwise binary ops mixing ``dtype`` and float32 run in ``dtype``, as a fused
  ``addmm`` casts its bias: so ``x @ W + b`` and ``relu`` keep half-precision activations.

Parameters stay float32 (the master weights); a ``Cast`` node's gradient is cast back, so
``p.grad`` is float32 too. Casts are graph nodes: the low-precision weight copies live until
backward, like torch's autocast cache.
"""
from typing import Any, Optional, Tuple

from .. import autograd
from ..autograd import Tensor
from ..backend_ndarray import to_numpy_dtype
from ..ops import ops_conv, ops_logarithmic, ops_mathematic, ops_reduce

__all__ = ["autocast", "autocast_dtype", "policy", "LOW_PRECISION", "FLOAT32", "NARROWING"]

LOW_PRECISION = (ops_mathematic.MatMul, ops_conv.Conv)
FLOAT32 = (ops_reduce.Summation, ops_logarithmic.LogSumExp, ops_logarithmic.LogSoftmax,
           ops_logarithmic.Softmax, ops_mathematic.Exp, ops_mathematic.Log,
           ops_mathematic.EWisePow, ops_mathematic.PowerScalar, ops_reduce.Max)
NARROWING = (ops_mathematic.EWiseAdd, ops_mathematic.EWiseMul, ops_mathematic.EWiseDiv,
             ops_mathematic.Maximum, ops_mathematic.Where)
_FLOATS = ("float16", "bfloat16", "float32")
_DTYPE: Optional[str] = None


def autocast_dtype() -> Optional[str]:
    """The active autocast dtype, or None outside ``autocast``."""
    return _DTYPE


def _cast_all(args: Tuple[Any, ...], src: Tuple[str, ...], dst: str) -> Tuple[Any, ...]:
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.dtype in src and a.dtype != dst:
            if isinstance(a.op, ops_mathematic.BroadcastTo):
                # cast the small source, not the broadcast view (no full-size copy is kept)
                a = ops_mathematic.broadcast_to(ops_mathematic.Cast(dst)(a.inputs[0]), a.shape)
            else:
                a = ops_mathematic.Cast(dst)(a)
        out.append(a)
    return tuple(out)


def policy(op: Any, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """The inputs ``op`` should see under the active autocast dtype."""
    low = _DTYPE
    if low is None or isinstance(op, ops_mathematic.Cast):
        return args
    if isinstance(op, LOW_PRECISION):
        return _cast_all(args, ("float32",), low)
    if isinstance(op, FLOAT32):
        return _cast_all(args, ("float16", "bfloat16"), "float32")
    if isinstance(op, NARROWING) and len(args) == 2:
        dtypes = {a.dtype for a in args if isinstance(a, Tensor)}
        if low in dtypes and "float32" in dtypes:
            return _cast_all(args, ("float32",), low)
    return args


class autocast(autograd.ModeContext):
    """Context manager (and decorator): mixed-precision forward in ``dtype``."""

    def __init__(self, dtype: str = "float16", enabled: bool = True):
        name = to_numpy_dtype(dtype).name
        if name not in ("float16", "bfloat16"):
            raise ValueError(f"autocast dtype must be float16 or bfloat16, got {dtype!r}")
        self.dtype = name
        self.enabled = enabled

    def __enter__(self) -> "autocast":
        global _DTYPE
        self._prev = (_DTYPE, autograd._AUTOCAST_HOOK)
        if self.enabled:
            _DTYPE = self.dtype
            autograd._AUTOCAST_HOOK = policy
        else:
            _DTYPE = None
            autograd._AUTOCAST_HOOK = None
        return self

    def __exit__(self, *exc: Any) -> None:
        global _DTYPE
        _DTYPE, autograd._AUTOCAST_HOOK = self._prev
