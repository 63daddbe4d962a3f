"""Fused array operations: one device primitive where the device offers it, else the naive
composition (``*_naive``, what kernels are tested against). Callers never name a backend."""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import capture_hooks, primitives
from .dtypes import FLOATS
from .ndarray import NDArray

# The optional primitives used below and the parameters a backend's versions take (flat
# ``Array`` buffers, compact), as primitives.py declares them; test_fused_dispatch.py checks
# the CUDA backend against them.
FUSED_PRIMITIVES = {p.name: p.params for p in primitives.FUSED_OPS}


def has_primitive(device: Any, name: str) -> bool:
    """True when ``device``'s backend offers the optional primitive ``name``."""
    return getattr(device, name, None) is not None


def _acc(dtype: str) -> str:
    """The accumulation dtype of a fused kernel for ``dtype`` inputs."""
    return "float64" if dtype == "float64" else "float32"


def _rows(x: NDArray) -> Tuple[NDArray, int, int]:
    """``x`` compact, as (array, rows, cols) over its last axis."""
    xc = x.compact()
    cols = x.shape[-1] if x.ndim else 1
    return xc, (math.prod(x.shape) // cols if cols else 0), cols


def _last_axis(x: NDArray, axis: int) -> Tuple[NDArray, Tuple[int, ...]]:
    """``x`` with ``axis`` moved last, and the permutation that undoes it."""
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        return x, tuple(range(x.ndim))
    order = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
    inverse = tuple(int(i) for i in np.argsort(order))
    return x.permute(order), inverse


def _primitive(x: NDArray, name: str) -> Any:
    """The device primitive ``name`` for ``x``; ValueError where its device has none."""
    prim = getattr(x.device, name, None)
    if prim is None:
        raise ValueError(f"{x.device} has no {name} primitive")
    return prim


def _fusable(x: NDArray, name: str) -> Optional[Any]:
    """The device primitive ``name`` for ``x``, or None (absent, or ``x`` not floating)."""
    prim = getattr(x.device, name, None)
    return prim if prim is not None and x.dtype in FLOATS and x.ndim else None


# ---------------------------------------------------------------------- softmax / logsumexp
def softmax_naive(x: NDArray, axis: int = -1) -> NDArray:
    """softmax along ``axis`` from max, subtract, exp, sum and divide (hw2.ops.logsumexp's
    answer but for a log: stubbed in the student release)."""
    if x.size == 0:  # e.g. rows of no columns: nothing to normalize (and max has no identity)
        return NDArray.make(x.shape, device=x.device, dtype=x.dtype)
    ### BEGIN YOUR SOLUTION (hw2.ops.logsumexp)
    z = (x - x.max(axis=axis, keepdims=True).broadcast_to(x.shape)).exp()
    return z / z.sum(axis=axis, keepdims=True).broadcast_to(x.shape)
    ### END YOUR SOLUTION


def softmax(x: NDArray, axis: int = -1) -> NDArray:
    """softmax along ``axis``; one kernel (online normalizer, arXiv:1805.02867) if offered."""
    prim = _fusable(x, "softmax_rows")
    if prim is None or not isinstance(axis, int):
        return softmax_naive(x, axis)
    xl, inverse = _last_axis(x, axis)
    xc, rows, cols = _rows(xl)
    out = NDArray.make(xc.shape, device=x.device, dtype=x.dtype)
    prim(xc._handle, out._handle, rows, cols)
    return out.permute(inverse) if inverse != tuple(range(x.ndim)) else out


def logsumexp_naive(x: NDArray, axis: int = -1) -> NDArray:
    """log(sum(exp(x - max))) + max along ``axis`` (the axis is removed): hw2.ops.logsumexp's
    answer, stubbed in the student release."""
    ### BEGIN YOUR SOLUTION (hw2.ops.logsumexp)
    m = x.max(axis=axis, keepdims=True)
    s = (x - m.broadcast_to(x.shape)).exp().sum(axis=axis, keepdims=True)
    return (s.log() + m).reshape(tuple(d for i, d in enumerate(x.shape) if i != axis % x.ndim))
    ### END YOUR SOLUTION


def logsumexp(x: NDArray, axis: int = -1) -> NDArray:
    """logsumexp along ``axis`` (the axis is removed); one kernel if the device offers it."""
    prim = _fusable(x, "logsumexp_rows")
    if prim is None or not isinstance(axis, int) or x.shape[axis] == 0:
        return logsumexp_naive(x, axis)
    xl, _ = _last_axis(x, axis)
    xc, rows, cols = _rows(xl)
    out = NDArray.make(xc.shape[:-1], device=x.device, dtype=x.dtype)
    prim(xc._handle, out._handle, rows, cols)
    return out


# ---------------------------------------------------------------------- layer norm
def layer_norm_naive(x: NDArray, weight: NDArray, bias: NDArray, eps: float = 1e-5
                     ) -> Tuple[NDArray, NDArray, NDArray]:
    """(y, mean, rstd) over the last axis from composed ops, as the course's LayerNorm1d
    (hw2.nn.layernorm1d's answer: stubbed in the student release)."""
    ### BEGIN YOUR SOLUTION (hw2.nn.layernorm1d)
    keep = x.shape[:-1] + (1,)
    cols = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True) / cols  # (..., 1)
    d = x - mean.broadcast_to(x.shape)
    rstd = ((d * d).sum(axis=-1, keepdims=True) / cols + eps) ** -0.5
    xhat = d * rstd.broadcast_to(x.shape)
    row = (1,) * (x.ndim - 1) + (cols,)
    w, b = weight.reshape(row), bias.reshape(row)
    y = xhat * w.broadcast_to(x.shape) + b.broadcast_to(x.shape)
    return y, mean.reshape(keep[:-1]), rstd.reshape(keep[:-1])
    ### END YOUR SOLUTION


def layer_norm(x: NDArray, weight: NDArray, bias: NDArray, eps: float = 1e-5
               ) -> Tuple[NDArray, NDArray, NDArray]:
    """(y, mean, rstd) over the last axis; mean and rstd float32 (float64) when fused."""
    prim = _fusable(x, "layer_norm_fwd")
    if prim is None:
        return layer_norm_naive(x, weight, bias, eps)
    xc, rows, cols = _rows(x)
    if weight.shape != (cols,) or bias.shape != (cols,):
        raise ValueError(f"layer_norm: weight {weight.shape} and bias {bias.shape} must be "
                         f"({cols},) for input {x.shape}")
    w, b = weight.astype(x.dtype).compact(), bias.astype(x.dtype).compact()
    y = NDArray.make(xc.shape, device=x.device, dtype=x.dtype)
    mean, rstd = (NDArray.make(x.shape[:-1], device=x.device, dtype=_acc(x.dtype))
                  for _ in range(2))
    prim(xc._handle, w._handle, b._handle, y._handle, mean._handle, rstd._handle, rows, cols,
         eps)
    return y, mean, rstd


def layer_norm_backward_naive(dy: NDArray, x: NDArray, weight: NDArray, mean: NDArray,
                              rstd: NDArray) -> Tuple[NDArray, NDArray, NDArray]:
    """(dx, dweight, dbias) of layer_norm from composed ops (the gradient of hw2.nn.layernorm1d's
    answer: stubbed in the student release)."""
    ### BEGIN YOUR SOLUTION (hw2.nn.layernorm1d)
    cols = x.shape[-1]
    lead = tuple(range(x.ndim - 1))
    col = x.shape[:-1] + (1,)
    r = rstd.reshape(col).broadcast_to(x.shape)
    xhat = (x - mean.reshape(col).broadcast_to(x.shape)) * r
    g = dy * weight.reshape((1,) * (x.ndim - 1) + (cols,)).broadcast_to(x.shape)
    mg = (g.sum(axis=-1, keepdims=True) / cols).broadcast_to(x.shape)
    mgx = ((g * xhat).sum(axis=-1, keepdims=True) / cols).broadcast_to(x.shape)
    dx = r * (g - mg - xhat * mgx)
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)
    ### END YOUR SOLUTION


def layer_norm_backward(dy: NDArray, x: NDArray, weight: NDArray, mean: NDArray,
                        rstd: NDArray) -> Tuple[NDArray, NDArray, NDArray]:
    """(dx, dweight, dbias) of layer_norm; dweight and dbias in ``x``'s dtype when fused."""
    prim = _fusable(x, "layer_norm_bwd")
    if prim is None:
        return layer_norm_backward_naive(dy, x, weight, mean, rstd)
    xc, rows, cols = _rows(x)
    dyc = dy.astype(x.dtype).compact()
    w = weight.astype(x.dtype).compact()
    acc = _acc(x.dtype)
    mc, rc = mean.astype(acc).compact(), rstd.astype(acc).compact()
    dx = NDArray.make(xc.shape, device=x.device, dtype=x.dtype)
    dw, db = (NDArray.make((cols,), device=x.device, dtype=acc) for _ in range(2))
    prim(dyc._handle, xc._handle, w._handle, mc._handle, rc._handle, dx._handle, dw._handle,
         db._handle, rows, cols)
    return dx, dw.astype(x.dtype), db.astype(x.dtype)


# ---------------------------------------------------------------------- multi-tensor steps
class MultiTensorState:
    """What a multi-tensor optimizer step keeps on one device for a group of parameters: a
    step count per slot (int64), the hyperparameters (float64), each uploaded only when it
    differs from what the device holds, and the primitive's cache (its pointer table)."""

    def __init__(self, device: Any, slots: int) -> None:
        self.device = device
        self.counts: List[int] = [0] * slots  # what ``steps`` holds on the device
        self.steps = NDArray(np.zeros(slots, dtype=np.int64), device=device)
        self.hyper: Optional[NDArray] = None
        self.hyper_values: Tuple[float, ...] = ()
        self.cache: Dict[str, Any] = {}

    def set_hyper(self, values: Tuple[float, ...]) -> None:
        """Make the device's hyperparameters ``values`` (an upload when they changed)."""
        if values == self.hyper_values:
            return
        host = np.array(values, dtype=np.float64)
        if self.hyper is None or self.hyper.size != host.size:
            self.hyper = NDArray(host, device=self.device)
        else:
            self.device.from_numpy(host, self.hyper._handle)
        self.hyper_values = values

    def begin_step(self, slots: Sequence[int], steps: Sequence[int]) -> None:
        """Before a step that makes slot ``slots[k]``'s count ``steps[k]``: upload the counts
        when the device's differ (state loaded or stepped elsewhere), then count the step
        (captured into a CUDA graph: at each replay, as the kernel counts on the device)."""
        counts = self.counts
        if [counts[s] + 1 for s in slots] != list(steps):
            for s, t in zip(slots, steps):
                counts[s] = t - 1
            self.device.from_numpy(np.array(counts, dtype=np.int64), self.steps._handle)
        for s in slots:
            counts[s] += 1
        if capture_hooks.CURRENT[0] is not None:
            def count(by: int, slots: Tuple[int, ...] = tuple(slots)) -> None:
                for s in slots:
                    counts[s] += by
            capture_hooks.counted_step(count)


def _check_lists(name: str, state: "MultiTensorState", slots: Sequence[int],
                 *lists: Sequence[Any]) -> None:
    """One entry per tensor in every list (zip would drop the longer lists' tail), and slots
    within ``state``'s: lengths and ints only, so the check adds no call per tensor."""
    lengths = [len(x) for x in (slots, *lists)]
    if len(set(lengths)) != 1:
        raise ValueError(f"{name}: the slot, parameter, gradient and state lists must have one "
                         f"entry per tensor, got lengths {lengths}")
    if min(slots) < 0 or max(slots) >= len(state.counts):
        raise ValueError(f"{name}: slots must lie in 0..{len(state.counts) - 1}, got "
                         f"{min(slots)}..{max(slots)}")


def multi_tensor_adam(params: Sequence[NDArray], grads: Sequence[NDArray],
                      ms: Sequence[NDArray], vs: Sequence[NDArray], slots: Sequence[int],
                      steps: Sequence[int], state: MultiTensorState, lr: float,
                      beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                      weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """One Adam/AdamW step in place on each ``params[k]`` (of one dtype and device; gradient
    ``grads[k]``, state ``ms[k]``, ``vs[k]``; this step is its ``steps[k]``-th, counted on the
    device at slot ``slots[k]`` of ``state``), all compact, m and v float32 (float64 for
    float64 params): two launches of the device's ``multi_tensor_adam`` on a GPU. The composed
    step is ``Adam.step`` itself (hw2.optim.adam), as for ``multi_tensor_sgd``."""
    if not params:
        return
    _check_lists("multi_tensor_adam", state, slots, params, grads, ms, vs, steps)
    prim = _primitive(params[0], "multi_tensor_adam")
    state.set_hyper((lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay))
    state.begin_step(slots, steps)
    assert state.hyper is not None
    prim([p._handle for p in params], [g._handle for g in grads], [m._handle for m in ms],
         [v._handle for v in vs], slots, state.steps._handle, state.hyper._handle, state.cache,
         decoupled)


def multi_tensor_sgd(params: Sequence[NDArray], grads: Sequence[NDArray],
                     us: Sequence[Optional[NDArray]], state: MultiTensorState, lr: float,
                     momentum: float = 0.0, weight_decay: float = 0.0) -> None:
    """One step of the course's SGD in place on each ``params[k]`` (of one dtype and device;
    gradient ``grads[k]``, momentum ``us[k]`` starting at zeros, None when ``momentum`` is 0),
    all compact, u float32 (float64 for float64 params): one launch of the device's
    ``multi_tensor_sgd``. There is no composed fallback here: that is ``SGD.step`` itself
    (hw2.optim.sgd), which calls this only where ``has_primitive`` says the device has it."""
    if not params:
        return
    prim = _primitive(params[0], "multi_tensor_sgd")
    state.set_hyper((lr, momentum, 1 - momentum, weight_decay))
    assert state.hyper is not None
    prim([p._handle for p in params], [g._handle for g in grads],
         [None if u is None else u._handle for u in us], state.hyper._handle, state.cache)


# ---------------------------------------------------------------------- dropout
def dropout_naive(x: NDArray, prob: float) -> Tuple[NDArray, NDArray]:
    """(y, mask) with a random array drawn on the host, compared, multiplied and scaled
    (hw2.nn.dropout's answer: stubbed in the student release)."""
    ### BEGIN YOUR SOLUTION (hw2.nn.dropout)
    keep = x.device.rand(*x.shape) >= prob  # NumPy's global RNG, like the course's init.randb
    mask = keep.astype(x.dtype)
    return x * mask / (1 - prob), keep
    ### END YOUR SOLUTION


def dropout(x: NDArray, prob: float, seed: Optional[int] = None, offset: int = 0
            ) -> Tuple[NDArray, NDArray]:
    """(y, bool mask): zero each entry with probability ``prob``, scale the rest by 1/(1-prob).

    With the device's ``dropout`` primitive the mask is drawn on the device and is replayable
    from (``seed``, ``offset``); ``seed`` defaults to a draw from NumPy's global RNG.
    """
    if not 0 <= prob < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {prob}")
    prim = _fusable(x, "dropout")
    if prim is None:
        return dropout_naive(x, prob)
    if seed is None:
        seed = int(np.random.randint(0, 2 ** 62))
    xc = x.compact()
    y = NDArray.make(x.shape, device=x.device, dtype=x.dtype)
    mask = NDArray.make(x.shape, device=x.device, dtype="bool")
    prim(xc._handle, y._handle, mask._handle, prob, seed, offset)
    return y, mask


def dropout_backward(dy: NDArray, mask: NDArray, prob: float) -> NDArray:
    """dx = dy * mask / (1 - prob); one kernel if the device offers it."""
    prim = _fusable(dy, "dropout_backward")
    if prim is None:
        return dy * mask.astype(dy.dtype) / (1 - prob)
    dyc = dy.compact()
    dx = NDArray.make(dy.shape, device=dy.device, dtype=dy.dtype)
    prim(dyc._handle, mask.compact()._handle, dx._handle, prob)
    return dx


# ---------------------------------------------------------------------- convolution, batch norm
# Convolution and batch norm as a GPU does them: im2col with implicit padding and one GEMM
# (Chellapilla et al., 2006), backward two GEMMs and one col2im; batch norm in two kernels
# each way. There is no composed fallback here: that is the course's own code (ops.Conv,
# hw4.ops.conv; nn.BatchNorm1d, hw2.nn.batchnorm1d), which calls these only where
# ``has_primitive`` says the device has them (``conv_im2col``, ``batch_norm_fwd``).


def _view(x: NDArray) -> Tuple[Tuple[int, ...], Tuple[int, ...], int]:
    return x.shape, x.strides, x._offset


def _like(x: NDArray) -> NDArray:
    """A new array of ``x``'s shape laid out in memory as ``x`` is when ``x`` is a permuted
    compact array (an NHWC buffer seen as NCHW stays NHWC: its consumer reads it as stored),
    else compact."""
    order = sorted(range(x.ndim), key=lambda i: -x.strides[i])
    dense = NDArray.compact_strides(tuple(x.shape[i] for i in order))
    strides = [0] * x.ndim
    for i, s in zip(order, dense):
        strides[i] = s
    keep = tuple(strides) == x.strides and x._offset == 0 and x.size == x._handle.size
    return NDArray.make(x.shape, strides=x.strides if keep else None, device=x.device,
                        dtype=x.dtype)


def _conv_sizes(x: NDArray, w: NDArray, stride: int, padding: int) -> Tuple[int, ...]:
    n, h, wd, c = x.shape
    kh, kw, c2, co = w.shape
    ho, wo = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    if c2 != c or ho < 1 or wo < 1 or x.dtype != w.dtype:
        raise ValueError(f"conv2d: input {x.shape} ({x.dtype}) and weights {w.shape} "
                         f"({w.dtype}) with stride {stride}, padding {padding}")
    return n, ho, wo, kh, kw, c, co


def _im2col(x: NDArray, kh: int, kw: int, stride: int, padding: int, rows: int) -> NDArray:
    cols = NDArray.make((rows, kh * kw * x.shape[3]), device=x.device, dtype=x.dtype)
    _primitive(x, "conv_im2col")(x._handle, cols._handle, _view(x), (kh, kw), stride, padding)
    return cols


def conv2d(x: NDArray, w: NDArray, bias: Optional[NDArray], stride: int, padding: int
           ) -> NDArray:
    """(N, Ho, Wo, Co) compact: the (N, H, W, C) view ``x`` (any strides) convolved with
    (KH, KW, C, Co) ``w`` (cross-correlation, zero padding), plus ``bias`` (Co,) if given:
    one im2col, one GEMM (and one bias launch)."""
    n, ho, wo, kh, kw, c, co = _conv_sizes(x, w, stride, padding)
    rows, inner = n * ho * wo, kh * kw * c
    cols = _im2col(x, kh, kw, stride, padding, rows)                  # (N*Ho*Wo, KH*KW*C)
    out = NDArray.make((n, ho, wo, co), device=x.device, dtype=x.dtype)
    x.device.matmul(cols._handle, w.compact()._handle, out._handle, 1, rows, inner, co,
                    False, False)
    if bias is not None:
        b = bias.astype(x.dtype).compact()
        _primitive(x, "conv_bias_add")(out._handle, b._handle, rows, co)
    return out


def conv2d_backward(dy: NDArray, x: NDArray, w: NDArray, stride: int, padding: int,
                    need_dx: bool = True, need_db: bool = False
                    ) -> Tuple[Optional[NDArray], NDArray, Optional[NDArray]]:
    """(dx, dw, db) of ``conv2d`` for dy (N, Ho, Wo, Co): dw = cols^T @ dy (cols recomputed,
    not kept from the forward), dcols = dy @ w^T (in cols' buffer), dx = col2im(dcols) laid
    out as ``x`` is, db = dy summed over (N, Ho, Wo). dx (db) is None unless ``need_dx``
    (``need_db``)."""
    n, ho, wo, kh, kw, c, co = _conv_sizes(x, w, stride, padding)
    rows, inner, dev = n * ho * wo, kh * kw * c, x.device
    g = dy.astype(x.dtype).compact()                                  # (N*Ho*Wo, Co)
    cols = _im2col(x, kh, kw, stride, padding, rows)
    dw = NDArray.make(w.shape, device=dev, dtype=x.dtype)
    dev.matmul(cols._handle, g._handle, dw._handle, 1, inner, rows, co, True, False)
    dx = db = None
    if need_dx:
        dcols = cols  # cols is read: its buffer takes dcols (launches run in order)
        dev.matmul(g._handle, w.compact()._handle, dcols._handle, 1, rows, co, inner, False,
                   True)
        dx = _like(x)
        _primitive(x, "conv_col2im")(dcols._handle, dx._handle, _view(dx), (ho, wo), (kh, kw),
                                     stride, padding)
    if need_db:
        db = NDArray.make((co,), device=dev, dtype=x.dtype)
        _primitive(x, "column_sum")(g._handle, db._handle, rows, co)
    return dx, dw, db


def batch_norm(x: NDArray, w: NDArray, b: NDArray, running_mean: NDArray,
               running_var: NDArray, momentum: float, eps: float
               ) -> Tuple[NDArray, NDArray, NDArray, NDArray]:
    """(y, stats, new_mean, new_var) of training-mode batch norm of (N, C, H, W) ``x`` (any
    strides) per channel, statistics over (N, H, W), the biased variance normalizing and
    updating the running ones: new = (1 - momentum) * running + momentum * batch. y is
    compact; ``stats`` (for ``batch_norm_backward``) holds mean and rstd."""
    prim = _primitive(x, "batch_norm_fwd")
    c, dev, dt = x.shape[1], x.device, x.dtype
    if x.ndim != 4 or x.size == 0:
        raise ValueError(f"batch_norm: needs a non-empty (N, C, H, W) input, got {x.shape}")
    w, b = w.astype(dt).compact(), b.astype(dt).compact()
    rm, rv = running_mean.astype(dt).compact(), running_var.astype(dt).compact()
    y = NDArray.make(x.shape, device=dev, dtype=dt)
    new_mean, new_var = (NDArray.make((c,), device=dev, dtype=dt) for _ in range(2))
    stats = NDArray.make((dev.batch_norm_stats_size(x.shape),), device=dev, dtype=_acc(dt))
    prim(x._handle, _view(x), w._handle, b._handle, rm._handle, rv._handle, y._handle,
         _view(y), new_mean._handle, new_var._handle, stats._handle, momentum, eps)
    return y, stats, new_mean, new_var


def batch_norm_backward(dy: NDArray, x: NDArray, w: NDArray, stats: NDArray
                        ) -> Tuple[NDArray, NDArray, NDArray]:
    """(dx, dw, db) of ``batch_norm`` (training statistics): with xhat = (x - mean) * rstd,
    dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) laid out as ``x`` is,
    dw = sum(dy * xhat), db = sum(dy) over (N, H, W)."""
    prim = _primitive(x, "batch_norm_bwd")
    c, dev, dt = x.shape[1], x.device, x.dtype
    g, wc = dy.astype(dt), w.astype(dt).compact()
    dx = _like(x)
    dw, db = (NDArray.make((c,), device=dev, dtype=dt) for _ in range(2))
    prim(g._handle, _view(g), x._handle, _view(x), wc._handle, stats._handle, dx._handle,
         _view(dx), dw._handle, db._handle)
    return dx, dw, db
