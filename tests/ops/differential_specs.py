"""The differential test's op table: each op once, with a random-case drawer and its PyTorch twin.

``SPECS`` maps a name to a ``Spec``: ``draw(d)`` returns the inputs' shapes and the op's
keyword arguments for one random case (``d`` is a ``Draw`` over a seeded generator), ``nd``
applies needle's op and ``th`` PyTorch's (``th(torch, *tensors, **kw)``). ``classes`` names
the needle op classes a spec exercises, so the test can check that every op is listed. Also
what both differential tests share: the seed and budget (``NEEDLE_FUZZ_*``, described in
``test_differential.py``), per-case generators, random view chains and input values.
"""
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import needle as ndl

Shape = Tuple[int, ...]
SIZES = (0, 1, 1, 2, 2, 3, 4)  # axis sizes: empty and single axes drawn often


class Draw:
    """Random choices for one case, from one seeded generator."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def pick(self, options: Sequence[Any]) -> Any:
        """One of ``options``."""
        return options[int(self.rng.integers(len(options)))]

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def shape(self, lo: int = 0, hi: int = 4, sizes: Sequence[int] = SIZES) -> Shape:
        """A shape of ``lo``..``hi`` axes."""
        return tuple(self.pick(sizes) for _ in range(self.int(lo, hi)))

    def axis(self, ndim: int) -> int:
        """An axis of ``ndim`` axes, negative half the time."""
        a = self.int(0, ndim - 1)
        return a - ndim if self.rng.random() < 0.5 else a

    def axes(self, ndim: int) -> Any:
        """None, an int, or a tuple of distinct axes (possibly empty)."""
        kind = self.int(0, 2) if ndim else 0
        if kind == 0:
            return None
        if kind == 1:
            return self.axis(ndim)
        return tuple(int(a) for a in sorted(self.rng.permutation(ndim)[:self.int(1, ndim)]))

    def broadcastable(self, out: Shape) -> Shape:
        """A shape that broadcasts to ``out``: leading axes dropped, some axes set to 1."""
        shape = out[self.int(0, len(out)):] if self.rng.random() < 0.3 else out
        return tuple(1 if self.rng.random() < 0.3 else s for s in shape)

    def same_size(self, shape: Shape) -> Shape:
        """Another shape with as many elements (one entry may be -1)."""
        size = int(np.prod(shape))
        if size == 0:
            out = list(self.shape(1, 3, (1, 2, 3)))
            out[self.int(0, len(out) - 1)] = 0
            return tuple(out)
        factors: List[int] = []
        for p in (2, 3, 5, 7):
            while size % p == 0:
                factors.append(p)
                size //= p
        factors += [size] if size > 1 else []
        out = [1] * self.int(1, 3)
        for f in factors:
            out[self.int(0, len(out) - 1)] *= f
        if self.rng.random() < 0.3:
            out[self.int(0, len(out) - 1)] = -1
        return tuple(out)


SEED = int(os.environ.get("NEEDLE_FUZZ_SEED", "0"))
CASES = {"cpu": int(os.environ.get("NEEDLE_FUZZ_CASES", "200")),
         "cuda": int(os.environ.get("NEEDLE_FUZZ_CUDA_CASES", "40"))}
View = Tuple[Any, ...]  # ("T", i, j) | ("S", axis, start, stop, step) | ("B", shape) | ("R", shape)


def apply_view_steps(x: Any, steps: Sequence[View], transpose: Callable[[Any, int, int], Any]
                     ) -> Any:
    """``x`` through view ``steps``; ``transpose(x, i, j)`` swaps two axes the caller's way
    (needle's op, NDArray's permute, or PyTorch's), the other steps are spelled alike."""
    for step in steps:
        if step[0] == "T":
            x = transpose(x, step[1], step[2])
        elif step[0] == "S":
            x = x[(slice(None),) * step[1] + (slice(*step[2:]),)]
        elif step[0] == "B":
            x = x.broadcast_to(step[1])
        else:
            x = x.reshape(step[1])
    return x


def case_rng(*key: Any) -> np.random.Generator:
    """A generator for one case, the same on every device (a stable hash of ``key``)."""
    return np.random.default_rng([SEED, zlib.crc32(repr(key).encode())])


def view_chain(d: Draw, shape: Shape, depth: int = 2) -> Tuple[Shape, List[View]]:
    """A base shape and up to ``depth`` view steps that turn it into an array of ``shape``."""
    kinds = ["plain", "slice", "broadcast", "reshape"] + (["transpose"] if len(shape) > 1 else [])
    kind = d.pick(kinds) if depth and d.rng.random() < 0.7 else "plain"
    if kind == "plain" or (kind == "slice" and not shape):
        return shape, []
    if kind == "transpose":
        i, j = (int(a) for a in d.rng.permutation(len(shape))[:2])
        src = list(shape)
        src[i], src[j] = src[j], src[i]
        step: View = ("T", i, j)
    elif kind == "slice":
        axis, start, stride = d.int(0, len(shape) - 1), d.int(0, 2), d.int(1, 3)
        src = list(shape)
        src[axis] = start + max(shape[axis] - 1, 0) * stride + (shape[axis] > 0) + d.int(0, 1)
        step = ("S", axis, start, start + shape[axis] * stride, stride)
    elif kind == "broadcast":
        src, step = list(d.broadcastable(shape)), ("B", shape)
    else:
        src, step = list(d.same_size(shape)), ("R", shape)
        src = [int(np.prod(shape)) // -int(np.prod(src)) if s == -1 else s for s in src]
    base, steps = view_chain(d, tuple(src), depth - 1)
    return base, steps + [step]


def draw_values(rng: np.random.Generator, kind: str, shape: Shape) -> np.ndarray:
    """Float64 values: "normal", "positive" (in [0.5, 2]), "away" (|x| in [0.5, 2]) or
    "spread" (pairwise at least 0.3 apart)."""
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "spread":  # distinct values 0.3 apart, shuffled: no two nearly equal
        size = int(np.prod(shape))
        return (rng.permutation(size).reshape(shape) - size / 2) * 0.3 + rng.uniform(0, 0.1)
    if kind == "away":
        return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return rng.standard_normal(shape)


@dataclass
class Spec:
    """One op: its case drawer, needle and PyTorch forms, input values and classes."""
    draw: Callable[[Draw], Tuple[List[Shape], Dict[str, Any]]]
    nd: Callable[..., Any]
    th: Callable[..., Any]
    classes: Tuple[str, ...]
    values: Tuple[str, ...] = ()  # per input: "normal" (default), "positive", "away", "spread"
    mixed: bool = True            # inputs may have different dtypes
    plain: Tuple[int, ...] = ()   # positions of inputs drawn without views
    # the reference casts the operands to the wider dtype first (needle's rule where
    # PyTorch's differs: a 0-d operand promotes as any other, matmul and conv promote)
    th_cast: bool = False
    # PyTorch's extra keyword arguments read from needle's outputs (dropout's mask)
    th_kw: Optional[Callable[[List[Any]], Dict[str, Any]]] = None
    # the devices whose backend has the op (a device kernel with no composed version)
    devices: Tuple[str, ...] = ("cpu", "cuda")


def _unary(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    return [d.shape()], {}


def _binary(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    out = d.shape()
    return [d.broadcastable(out), d.broadcastable(out)], {}


def _scalar(values: Sequence[float]) -> Callable[[Draw], Tuple[List[Shape], Dict[str, Any]]]:
    return lambda d: ([d.shape()], {"s": d.pick(values)})


def _reduce(nonempty: bool) -> Callable[[Draw], Tuple[List[Shape], Dict[str, Any]]]:
    def draw(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
        shape = d.shape(0, 4, (1, 2, 3, 4) if nonempty else SIZES)
        return [shape], {"axes": d.axes(len(shape)), "keepdims": d.pick([False, True])}
    return draw


def _along_axis(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(1, 4)
    return [shape], {"axis": d.axis(len(shape))}


def _transpose(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(2, 4)
    axes = None if d.rng.random() < 0.3 else tuple(
        int(a) for a in d.rng.permutation(len(shape))[:2])
    return [shape], {"axes": axes}


def _matmul(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    m, n, p = d.pick(SIZES), d.pick(SIZES), d.pick(SIZES)
    batch = d.shape(0, 2)
    a, b = (m, n), (n, p)
    kind = d.int(0, 3)
    if kind == 1:
        a = d.broadcastable(batch) + a
    elif kind == 2:
        b = d.broadcastable(batch) + b
    elif kind == 3:
        a, b = d.broadcastable(batch) + a, d.broadcastable(batch) + b
    return [a, b], {}


def _where(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    out = d.shape()
    cond = np.asarray(d.rng.random(d.broadcastable(out)) < 0.5)
    return [d.broadcastable(out), d.broadcastable(out)], {"cond": cond}


def _stack(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(0, 3)
    return [shape] * d.int(1, 4), {"axis": d.axis(len(shape) + 1)}


def _split(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = list(d.shape(1, 4))
    axis = d.axis(len(shape))
    shape[axis] = d.int(1, 4)  # zero pieces leave nothing to differentiate
    return [tuple(shape)], {"axis": axis}


def _index_part(d: Draw, n: int) -> Any:
    """An int or a slice (any step sign) valid for an axis of size ``n``."""
    if n and d.rng.random() < 0.25:
        return d.int(-n, n - 1)
    start, stop = (d.pick([None, d.int(-n - 1, n + 1)]) for _ in range(2))
    return slice(start, stop, d.pick([None, 1, 2, 3, -1, -2]))


def _get_item(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(1, 4)
    idx: Tuple[Any, ...] = tuple(_index_part(d, n) for n in shape[:d.int(1, len(shape))])
    if d.rng.random() < 0.3:
        idx = (Ellipsis,) + idx[1:]
    return [shape], {"idx": idx}


def _th_get_item(T: Any, a: Any, idx: Tuple[Any, ...]) -> Any:
    """a[idx] in PyTorch (which has no negative steps): each part as NumPy's positions."""
    lead = a.ndim - (len(idx) - 1) if Ellipsis in idx else 0
    parts = [slice(None)] * lead + list(idx[1:]) if Ellipsis in idx else list(idx)
    dim = 0
    for part in parts:
        pos = np.arange(a.shape[dim])[part]
        if np.ndim(pos) == 0:
            a = a.select(dim, int(pos))
        else:
            a = a.index_select(dim, T.tensor(pos.tolist(), dtype=T.int64))
            dim += 1
    return a


def _embedding(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    rows = d.int(1, 5)
    idx = d.rng.integers(0, rows, d.shape(0, 2))
    return [(rows, d.pick(SIZES))], {"idx": idx}


def _conv_axes(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(1, 4)
    axes = tuple(int(a) for a in sorted(d.rng.permutation(len(shape))[:d.int(1, len(shape))]))
    return [shape], {"axes": axes, "dilation": d.int(0, 2)}


def _undilate(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shapes, kw = _conv_axes(d)
    return [tuple(n * (kw["dilation"] + 1) if i in kw["axes"] else n
                  for i, n in enumerate(shapes[0]))], kw


def _pad(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(1, 4)
    return [shape], {"axes": tuple((d.int(0, 2), d.int(0, 2)) for _ in shape)}


def _conv(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    k, stride, padding, c_in = d.int(1, 3), d.int(1, 3), d.int(0, 2), d.int(1, 3)
    h, w = (d.int(max(1, k - 2 * padding), 6) for _ in range(2))
    return ([(d.int(0, 2), h, w, c_in), (k, k, c_in, d.int(1, 3))],
            {"stride": stride, "padding": padding})


def _conv_bias(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shapes, kw = _conv(d)
    return shapes + [shapes[1][-1:]], kw


def _nd_conv_bias(x: Any, w: Any, b: Any, stride: int, padding: int) -> Any:
    return ops.ConvBias(stride, padding)(x, w, b)


def _th_conv_bias(T: Any, x: Any, w: Any, b: Any, stride: int, padding: int) -> Any:
    return _th_conv(T, x, w, stride, padding) + b


def _batch_norm(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    c = d.int(1, 4)
    return [(d.int(2, 3), c, d.int(1, 4), d.int(1, 4)), (c,), (c,)], {}  # torch: N*H*W > 1


def _nd_batch_norm(x: Any, w: Any, b: Any) -> Any:
    """Training-mode batch norm on the device's kernels (running statistics discarded)."""
    import needle.backend_ndarray as nd
    c, dev = x.shape[1], x.device
    return ops.BatchNorm(nd.zeros((c,), dtype=x.dtype, device=dev),
                         nd.ones((c,), dtype=x.dtype, device=dev), 0.1, 1e-5)(x, w, b)


def _th_batch_norm(T: Any, x: Any, w: Any, b: Any) -> Any:
    return T.nn.functional.batch_norm(x, None, None, w, b, training=True, eps=1e-5)


def _flip(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    shape = d.shape(1, 4)
    return [shape], {"axes": tuple(sorted({d.int(0, len(shape) - 1) for _ in range(2)}))}


def _layer_norm(d: Draw) -> Tuple[List[Shape], Dict[str, Any]]:
    x = d.shape(1, 3) + (d.int(1, 5),)
    return [x, x[-1:], x[-1:]], {}


def _dilate_th(T: Any, a: Any, axes: Tuple[int, ...], dilation: int) -> Any:
    shape = [n * (dilation + 1) if i in axes else n for i, n in enumerate(a.shape)]
    out = T.zeros(shape, dtype=a.dtype)
    out[tuple(slice(None, None, dilation + 1) if i in axes else slice(None)
              for i in range(a.ndim))] = a
    return out


def _dropout(x: Any, p: float) -> Any:
    return ndl.ops.dropout(x, p, seed=7)


def _dropout_th(T: Any, x: Any, p: float, mask: Optional[np.ndarray] = None) -> Any:
    """x * mask / (1 - p) with needle's keep-mask (PyTorch's generator draws another one)."""
    return x * T.from_numpy(mask) / (1 - p)


def _dropout_mask(outs: List[Any]) -> Dict[str, Any]:
    """needle's keep-mask, read from its output (the inputs are nonzero)."""
    return {"mask": np.asarray(outs[0].numpy() != 0)}


def _tuple_items(*ts: Any) -> List[Any]:
    tup = ndl.ops.make_tuple(*ts)
    return [ndl.ops.TupleGetItem(i)(tup, fold_const=False) for i in range(len(ts))]


def _th_axes(a: Any, axes: Any) -> Tuple[int, ...]:
    return tuple(range(a.ndim)) if axes is None else (axes,) if isinstance(axes, int) else axes


def _th_transpose(a: Any, axes: Any) -> Any:
    return a.transpose(*(axes or (-2, -1)))


def _th_pad(T: Any, a: Any, axes: Any) -> Any:
    return T.nn.functional.pad(a, [p for pair in reversed(axes) for p in pair])


def _th_conv(T: Any, x: Any, w: Any, stride: int, padding: int) -> Any:
    out = T.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1).contiguous(),
                                 stride=stride, padding=padding)
    return out.permute(0, 2, 3, 1)


ops = ndl.ops
SPECS: Dict[str, Spec] = {
    "add": Spec(_binary, ops.add, lambda T, a, b: a + b, ("EWiseAdd",), th_cast=True),
    "sub": Spec(_binary, lambda a, b: a - b, lambda T, a, b: a - b, ("EWiseAdd", "Negate"),
                th_cast=True),
    "multiply": Spec(_binary, ops.multiply, lambda T, a, b: a * b, ("EWiseMul",), th_cast=True),
    "divide": Spec(_binary, ops.divide, lambda T, a, b: a / b, ("EWiseDiv",), ("normal", "away"),
                   th_cast=True),
    "power": Spec(_binary, ops.power, lambda T, a, b: a ** b, ("EWisePow",), ("positive",),
                  th_cast=True),
    "maximum": Spec(_binary, ops.maximum, lambda T, a, b: T.maximum(a, b), ("Maximum",),
                    th_cast=True),
    "add_scalar": Spec(_scalar([-2, 0.5, 1.5]), lambda a, s: ops.add_scalar(a, s),
                       lambda T, a, s: a + s, ("AddScalar",)),
    "rsub": Spec(_scalar([-1, 2.5]), lambda a, s: s - a, lambda T, a, s: s - a,
                 ("AddScalar", "Negate")),
    "mul_scalar": Spec(_scalar([-1.5, 0, 3]), lambda a, s: ops.mul_scalar(a, s),
                       lambda T, a, s: a * s, ("MulScalar",)),
    "divide_scalar": Spec(_scalar([-0.5, 2.5, 4]), lambda a, s: ops.divide_scalar(a, s),
                          lambda T, a, s: a / s, ("DivScalar",)),
    "rdiv": Spec(_scalar([1.5, -2]), lambda a, s: s / a, lambda T, a, s: s / a,
                 ("MulScalar", "PowerScalar"), ("away",)),
    "power_scalar": Spec(_scalar([2, 3, 0.5, -1.5, 0]), lambda a, s: ops.power_scalar(a, s),
                         lambda T, a, s: a ** s, ("PowerScalar",), ("positive",)),
    "maximum_scalar": Spec(_scalar([-0.3, 0.25]), lambda a, s: ops.maximum(a, s),
                           lambda T, a, s: T.clamp(a, min=s), ("MaximumScalar",)),
    "negate": Spec(_unary, ops.negate, lambda T, a: -a, ("Negate",)),
    "log": Spec(_unary, ops.log, lambda T, a: T.log(a), ("Log",), ("positive",)),
    "exp": Spec(_unary, ops.exp, lambda T, a: T.exp(a), ("Exp",)),
    "relu": Spec(_unary, ops.relu, lambda T, a: T.relu(a), ("ReLU",)),
    "tanh": Spec(_unary, ops.tanh, lambda T, a: T.tanh(a), ("Tanh",)),
    "sigmoid": Spec(_unary, ops.sigmoid, lambda T, a: T.sigmoid(a), ("Sigmoid",)),
    "cast": Spec(lambda d: ([d.shape()], {"dtype": d.pick(["float32", "float64"])}), ops.cast,
                 lambda T, a, dtype: a.to(getattr(T, dtype)), ("Cast",)),
    "transpose": Spec(_transpose, ops.transpose, lambda T, a, axes: _th_transpose(a, axes),
                      ("Transpose",)),
    "reshape": Spec(lambda d: ([s := d.shape()], {"shape": d.same_size(s)}), ops.reshape,
                    lambda T, a, shape: a.reshape(shape), ("Reshape",)),
    "broadcast_to": Spec(lambda d: ([d.broadcastable(s := d.shape())], {"shape": s}),
                         ops.broadcast_to, lambda T, a, shape: a.broadcast_to(shape),
                         ("BroadcastTo",)),
    "summation": Spec(_reduce(False), ops.summation, lambda T, a, axes, keepdims: a.sum(
        dim=_th_axes(a, axes), keepdim=keepdims), ("Summation",)),
    "mean": Spec(_reduce(False), ops.mean, lambda T, a, axes, keepdims: a.mean(
        dim=_th_axes(a, axes), keepdim=keepdims), ("Summation", "DivScalar")),
    "max": Spec(_reduce(False), ops.max, lambda T, a, axes, keepdims: T.amax(
        a, dim=_th_axes(a, axes), keepdim=keepdims), ("Max",)),
    "matmul": Spec(_matmul, ops.matmul, lambda T, a, b: a @ b, ("MatMul",), th_cast=True),
    "where": Spec(_where, lambda a, b, cond: ops.where(cond, a, b),
                  lambda T, a, b, cond: T.where(T.from_numpy(cond), a, b), ("Where",),
                  th_cast=True),
    "logsumexp": Spec(lambda d: ([s := d.shape()], {"axes": d.axes(len(s))}), ops.logsumexp,
                      lambda T, a, axes: T.logsumexp(a, dim=_th_axes(a, axes)),
                      ("LogSumExp",)),
    "logsoftmax": Spec(_along_axis, ops.logsoftmax, lambda T, a, axis: T.log_softmax(a, axis),
                       ("LogSoftmax",)),
    "softmax": Spec(_along_axis, ops.softmax, lambda T, a, axis: T.softmax(a, axis),
                    ("Softmax",)),
    "stack": Spec(_stack, lambda *ts, axis: ops.stack(list(ts), axis),
                  lambda T, *ts, axis: T.stack(ts, axis), ("Stack", "MakeTensorTuple", "Split"),
                  mixed=False),
    "split": Spec(_split, ops.split, lambda T, a, axis: list(T.unbind(a, axis)),
                  ("Split", "TupleGetItem", "Stack")),
    "tuple_get_item": Spec(lambda d: ([d.shape() for _ in range(d.int(1, 3))], {}),
                           _tuple_items, lambda T, *ts: list(ts),
                           ("MakeTensorTuple", "TupleGetItem")),
    "fused_add_scalars": Spec(lambda d: ([d.shape()], {"c0": 1.5, "c1": -2.0}),
                              ops.fused_add_scalars, lambda T, a, c0, c1: [a + c0, a + c1],
                              ("FusedAddScalars",)),
    "get_item": Spec(_get_item, lambda a, idx: a[idx], _th_get_item, ("GetItem", "ScatterItem")),
    "embedding": Spec(_embedding, lambda a, idx: ops.embedding(a, idx),
                      lambda T, a, idx: a[T.from_numpy(idx)], ("TakeRows", "ScatterAddRows")),
    "flip": Spec(_flip, ops.flip, lambda T, a, axes: T.flip(a, axes), ("Flip",)),
    "dilate": Spec(_conv_axes, ops.dilate, _dilate_th, ("Dilate", "UnDilate")),
    "undilate": Spec(_undilate, ops.undilate, lambda T, a, axes, dilation: a[tuple(
        slice(None, None, dilation + 1) if i in axes else slice(None) for i in range(a.ndim))],
        ("UnDilate", "Dilate")),
    "pad": Spec(_pad, ops.pad, _th_pad, ("Pad",)),
    "conv": Spec(_conv, ops.conv, _th_conv, ("Conv",), th_cast=True),
    "conv_bias": Spec(_conv_bias, _nd_conv_bias, _th_conv_bias, ("ConvBias", "ConvBackward"),
                      th_cast=True, mixed=False, devices=("cuda",)),
    "batch_norm": Spec(_batch_norm, _nd_batch_norm, _th_batch_norm,
                       ("BatchNorm", "BatchNormBackward"), mixed=False, plain=(1, 2),
                       devices=("cuda",)),
    "layer_norm": Spec(_layer_norm, lambda x, w, b: ops.layer_norm(x, w, b),
                       lambda T, x, w, b: T.nn.functional.layer_norm(x, x.shape[-1:], w, b),
                       ("LayerNorm", "LayerNormBackward"), ("spread",), mixed=False,
                       plain=(0,)),
    "dropout": Spec(lambda d: ([d.shape()], {"p": d.pick([0.0, 0.5])}), _dropout, _dropout_th,
                    ("Dropout",), ("away",), th_kw=_dropout_mask),
}
