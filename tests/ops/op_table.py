"""The tests' op table: each op once, with its NumPy (and torch) reference, inputs and cases.

``OPS`` maps a name to the needle callable, the NumPy reference, an optional torch reference,
input generators and cases; ``make_inputs`` draws a case's inputs. ``test_ops.py`` parametrizes
over op x case x device; the compiler tests replay the same table compiled.
"""
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import needle as ndl

Shape = Tuple[int, ...]


@dataclass
class Case:
    """Input shapes and keyword arguments for one parametrization of an op."""
    shapes: Tuple[Shape, ...]
    kw: Dict[str, Any] = field(default_factory=dict)


@dataclass
class OpSpec:
    """An op, its NumPy (and optional torch) reference, input generators and cases."""
    fn: Callable[..., Any]
    ref: Callable[..., Any]
    cases: List[Case]
    gens: Tuple[str, ...] = ()  # per input: "normal" (default), "positive", "away", "distinct"
    torch: Optional[Callable[..., Any]] = None  # (torch_module, *tensors, **kw) -> output(s)


def C(*shapes: Shape, **kw: Any) -> Case:
    """A case with the given input shapes and keyword arguments."""
    return Case(tuple(shapes), kw)


def _mask(shape: Shape) -> np.ndarray:
    """A fixed boolean mask with both values present (for ``where``)."""
    return (np.arange(int(np.prod(shape))).reshape(shape) % 3) == 1


def np_dilate(a: np.ndarray, axes: Sequence[int], dilation: int) -> np.ndarray:
    """Reference dilation: ``dilation`` zeros after every element along ``axes``."""
    shape = tuple(s * (dilation + 1) if i in axes else s for i, s in enumerate(a.shape))
    out = np.zeros(shape, dtype=a.dtype)
    out[tuple(slice(None, None, dilation + 1) if i in axes else slice(None)
              for i in range(a.ndim))] = a
    return out


def np_undilate(a: np.ndarray, axes: Sequence[int], dilation: int) -> np.ndarray:
    """Reference undilation: every (dilation+1)-th element along ``axes``."""
    return a[tuple(slice(None, None, dilation + 1) if i in axes else slice(None)
                   for i in range(a.ndim))]


def np_conv(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    """Reference NHWC convolution: a direct loop over the kernel offsets."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    n, h, wd, _ = x.shape
    k, _, _, c_out = w.shape
    oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
    out = np.zeros((n, oh, ow, c_out), dtype=np.result_type(x, w))
    for i in range(k):
        for j in range(k):
            patch = x[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nhwc,co->nhwo", patch, w[i, j])
    return out


def np_logsumexp(a: np.ndarray, axes: Any = None) -> np.ndarray:
    """Reference stable logsumexp."""
    m = np.max(a, axis=axes, keepdims=True)
    return np.squeeze(m, axis=axes) + np.log(np.sum(np.exp(a - m), axis=axes))


def np_logsoftmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Reference stable log-softmax."""
    m = np.max(a, axis=axis, keepdims=True)
    return a - m - np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))


def _tdims(a: Any, axes: Any) -> Tuple[int, ...]:
    """torch dims for a needle/NumPy ``axes`` argument (None: all)."""
    if axes is None:
        return tuple(range(a.ndim))
    return (axes,) if isinstance(axes, int) else tuple(axes)


def _tpad(axes: Sequence[Tuple[int, int]]) -> List[int]:
    """torch's F.pad argument (last axis first) for per-axis (before, after) pairs."""
    return [p for pair in reversed(axes) for p in pair]


def _tconv(T: Any, x: Any, w: Any, stride: int = 1, padding: int = 0) -> Any:
    """torch conv2d on NHWC input and (K, K, C_in, C_out) weights."""
    out = T.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1),
                                 stride=stride, padding=padding)
    return out.permute(0, 2, 3, 1)


def _nd_stack(*ts: Any, axis: int) -> Any:
    return ndl.ops.stack(list(ts), axis=axis)


def _tuple_items(*ts: Any) -> List[Any]:
    """Every element of make_tuple(*ts), read through TupleGetItem (not constant-folded)."""
    tup = ndl.ops.make_tuple(*ts)
    return [ndl.ops.TupleGetItem(i)(tup, fold_const=False) for i in range(len(ts))]


S = slice
ELL = Ellipsis
BINARY_SHAPES = [C((3, 4), (3, 4)), C((3, 1), (1, 4)), C((2, 3, 4), (4,)), C((2, 1, 4), (3, 1)),
                 C((), (2, 3))]

OPS: Dict[str, OpSpec] = {
    "add": OpSpec(ndl.ops.add, np.add, BINARY_SHAPES, torch=lambda T, a, b: a + b),
    "add_scalar": OpSpec(lambda a, s: ndl.ops.add_scalar(a, s), lambda a, s: a + s,
                         [C((3, 4), s=1.5), C((5,), s=-2)], torch=lambda T, a, s: a + s),
    "multiply": OpSpec(ndl.ops.multiply, np.multiply, BINARY_SHAPES,
                       torch=lambda T, a, b: a * b),
    "mul_scalar": OpSpec(lambda a, s: ndl.ops.mul_scalar(a, s), lambda a, s: a * s,
                         [C((3, 4), s=-1.5), C((2, 3, 2), s=3)], torch=lambda T, a, s: a * s),
    "power": OpSpec(ndl.ops.power, np.power, [C((3, 4), (3, 4)), C((2, 3), (3,)),
                                              C((3, 1), (1, 2))],
                    gens=("positive", "normal"), torch=lambda T, a, b: a ** b),
    "power_scalar": OpSpec(lambda a, s: ndl.ops.power_scalar(a, s), lambda a, s: a ** s,
                           [C((3, 4), s=2.5), C((5,), s=-1.5), C((2, 3), s=3)],
                           gens=("positive",), torch=lambda T, a, s: a ** s),
    "divide": OpSpec(ndl.ops.divide, np.divide, [C((3, 4), (3, 4)), C((3, 1), (1, 4)),
                                                 C((4,), (2, 3, 4))],
                     gens=("normal", "away"), torch=lambda T, a, b: a / b),
    "divide_scalar": OpSpec(lambda a, s: ndl.ops.divide_scalar(a, s), lambda a, s: a / s,
                            [C((3, 4), s=2.5), C((2, 2), s=-0.5)], torch=lambda T, a, s: a / s),
    "negate": OpSpec(ndl.ops.negate, np.negative, [C((3, 4)), C((2, 1, 3))],
                     torch=lambda T, a: -a),
    "log": OpSpec(ndl.ops.log, np.log, [C((3, 4)), C((2, 3, 2))], gens=("positive",),
                  torch=lambda T, a: T.log(a)),
    "exp": OpSpec(ndl.ops.exp, np.exp, [C((3, 4)), C((5,))], torch=lambda T, a: T.exp(a)),
    "relu": OpSpec(ndl.ops.relu, lambda a: np.maximum(a, 0), [C((3, 4)), C((2, 3, 2))],
                   gens=("distinct",), torch=lambda T, a: T.relu(a)),
    "tanh": OpSpec(ndl.ops.tanh, np.tanh, [C((3, 4)), C((6,))], torch=lambda T, a: T.tanh(a)),
    "sigmoid": OpSpec(ndl.ops.sigmoid, lambda a: 1 / (1 + np.exp(-a)), [C((3, 4)), C((6,))],
                      torch=lambda T, a: T.sigmoid(a)),
    "transpose": OpSpec(lambda a, axes: ndl.ops.transpose(a, axes),
                        lambda a, axes: np.swapaxes(a, *(axes or (-2, -1))),
                        [C((3, 4), axes=None), C((2, 3, 4), axes=None),
                         C((2, 3, 4), axes=(0, 2)), C((2, 3, 4, 1), axes=(1, 3))],
                        torch=lambda T, a, axes: a.transpose(*(axes or (-2, -1)))),
    "reshape": OpSpec(lambda a, shape: ndl.ops.reshape(a, shape),
                      lambda a, shape: np.reshape(a, shape),
                      [C((3, 4), shape=(2, 6)), C((2, 3, 4), shape=(4, -1)),
                       C((6,), shape=(1, 6, 1)), C((1,), shape=())],
                      torch=lambda T, a, shape: a.reshape(shape)),
    "broadcast_to": OpSpec(lambda a, shape: ndl.ops.broadcast_to(a, shape),
                           lambda a, shape: np.broadcast_to(a, shape),
                           [C((3, 1), shape=(3, 4)), C((4,), shape=(2, 3, 4)),
                            C((1,), shape=(5,)), C((2, 1, 3), shape=(4, 2, 5, 3)),
                            C((), shape=(2, 2))],
                           torch=lambda T, a, shape: a.broadcast_to(shape)),
    "summation": OpSpec(lambda a, axes, keepdims=False: ndl.ops.summation(a, axes, keepdims),
                        lambda a, axes, keepdims=False: np.sum(a, axis=axes, keepdims=keepdims),
                        [C((3, 4), axes=None), C((3, 4), axes=0), C((2, 3, 4), axes=(0, 2)),
                         C((2, 3, 4), axes=-1, keepdims=True), C((2, 3, 4), axes=(1,))],
                        torch=lambda T, a, axes, keepdims=False: a.sum(dim=_tdims(a, axes),
                                                                       keepdim=keepdims)),
    "mean": OpSpec(lambda a, axes: ndl.ops.mean(a, axes), lambda a, axes: np.mean(a, axis=axes),
                   [C((3, 4), axes=None), C((2, 3, 4), axes=(0, 2))],
                   torch=lambda T, a, axes: a.mean(dim=_tdims(a, axes))),
    "matmul": OpSpec(ndl.ops.matmul, np.matmul,
                     [C((3, 4), (4, 5)), C((2, 3, 4), (2, 4, 5)), C((2, 3, 4), (4, 5)),
                      C((3, 4), (2, 4, 5)), C((2, 1, 3, 4), (3, 4, 2)), C((1, 3, 4), (2, 4, 5)),
                      C((1, 1), (1, 3))],
                     torch=lambda T, a, b: a @ b),
    "maximum": OpSpec(ndl.ops.maximum, np.maximum, [C((3, 4), (3, 4)), C((3, 1), (1, 4))],
                      gens=("distinct", "distinct"), torch=lambda T, a, b: T.maximum(a, b)),
    "maximum_scalar": OpSpec(lambda a, s: ndl.ops.maximum(a, s), lambda a, s: np.maximum(a, s),
                             [C((3, 4), s=0.25)], gens=("distinct",),
                             torch=lambda T, a, s: T.clamp(a, min=s)),
    "max": OpSpec(lambda a, axes, keepdims=False: ndl.ops.max(a, axes, keepdims),
                  lambda a, axes, keepdims=False: np.max(a, axis=axes, keepdims=keepdims),
                  [C((3, 4), axes=None), C((3, 4), axes=1), C((2, 3, 4), axes=(0, 2)),
                   C((2, 3, 4), axes=-2, keepdims=True)],
                  gens=("distinct",),
                  torch=lambda T, a, axes, keepdims=False: T.amax(a, dim=_tdims(a, axes),
                                                                  keepdim=keepdims)),
    "where": OpSpec(lambda a, b, cond: ndl.ops.where(_mask(cond), a, b),
                    lambda a, b, cond: np.where(_mask(cond), a, b),
                    [C((3, 4), (3, 4), cond=(3, 4)), C((3, 1), (4,), cond=(3, 4)),
                     C((2, 3, 4), (2, 3, 4), cond=(3, 4))],
                    torch=lambda T, a, b, cond: T.where(T.from_numpy(_mask(cond)), a, b)),
    "logsumexp": OpSpec(lambda a, axes: ndl.ops.logsumexp(a, axes), np_logsumexp,
                        [C((3, 4), axes=None), C((3, 4), axes=(1,)), C((2, 3, 4), axes=(0, 2)),
                         C((2, 3, 4), axes=-2), C((5,), axes=0)],
                        torch=lambda T, a, axes: T.logsumexp(a, dim=_tdims(a, axes))),
    "logsoftmax": OpSpec(lambda a, axis: ndl.ops.logsoftmax(a, axis), np_logsoftmax,
                         [C((3, 4), axis=-1), C((2, 3, 4), axis=1), C((5,), axis=0)],
                         torch=lambda T, a, axis: T.log_softmax(a, dim=axis)),
    "softmax": OpSpec(lambda a, axis: ndl.ops.softmax(a, axis),
                      lambda a, axis: np.exp(np_logsoftmax(a, axis)),
                      [C((3, 4), axis=-1), C((2, 3, 4), axis=0)],
                      torch=lambda T, a, axis: T.softmax(a, dim=axis)),
    "stack": OpSpec(_nd_stack, lambda *xs, axis: np.stack(xs, axis=axis),
                    [C((2, 3), (2, 3), (2, 3), axis=0), C((2, 3), (2, 3), axis=2),
                     C((4,), (4,), axis=-1), C((2, 1, 3), axis=1)],
                    torch=lambda T, *xs, axis: T.stack(xs, dim=axis)),
    "split": OpSpec(lambda a, axis: ndl.ops.split(a, axis),
                    lambda a, axis: list(np.moveaxis(a, axis, 0)),
                    [C((3, 4), axis=0), C((2, 3, 4), axis=1), C((2, 3, 2), axis=-1)],
                    torch=lambda T, a, axis: list(T.unbind(a, dim=axis))),
    "tuple_get_item": OpSpec(_tuple_items, lambda *xs: list(xs), [C((2, 3), (4,)), C((3,))],
                             torch=lambda T, *xs: list(xs)),
    "fused_add_scalars": OpSpec(lambda a, c0, c1: ndl.ops.fused_add_scalars(a, c0, c1),
                                lambda a, c0, c1: [a + c0, a + c1],
                                [C((3, 4), c0=1.5, c1=-2.0)],
                                torch=lambda T, a, c0, c1: [a + c0, a + c1]),
    "get_item": OpSpec(lambda a, idx: a[idx], lambda a, idx: a[idx],
                       [C((4, 5, 3), idx=(S(1, 3),)), C((4, 5, 3), idx=(S(None, None, 2), 1)),
                        C((4, 5, 3), idx=(-1, S(None, None, -1))),
                        C((4, 5, 3), idx=(ELL, S(1, None, 2))),
                        C((4, 5, 3), idx=(S(3, 0, -2), S(-4, -1), -2)),
                        C((4, 5, 3), idx=2), C((6,), idx=S(-2, 0, -3)),
                        C((4, 5), idx=(S(None), S(5, 1, -1)))],
                       torch=None),
    "flip": OpSpec(lambda a, axes: ndl.ops.flip(a, axes), lambda a, axes: np.flip(a, axes),
                   [C((3, 4), axes=(0,)), C((2, 3, 4), axes=(0, 2)), C((2, 3, 4), axes=(1, 2)),
                    C((5,), axes=(0,))],
                   torch=lambda T, a, axes: T.flip(a, dims=axes)),
    "dilate": OpSpec(lambda a, axes, dilation: ndl.ops.dilate(a, axes, dilation), np_dilate,
                     [C((3, 4), axes=(0,), dilation=1), C((2, 3, 2), axes=(1, 2), dilation=2),
                      C((2, 3), axes=(0, 1), dilation=0)]),
    "undilate": OpSpec(lambda a, axes, dilation: ndl.ops.undilate(a, axes, dilation), np_undilate,
                       [C((6, 4), axes=(0,), dilation=1), C((2, 6, 3), axes=(1, 2), dilation=2),
                        C((5, 3), axes=(0,), dilation=1)]),
    "pad": OpSpec(lambda a, axes: ndl.ops.pad(a, axes), lambda a, axes: np.pad(a, axes),
                  [C((3, 4), axes=((1, 2), (0, 1))), C((1, 3, 3, 2), axes=((0, 0), (2, 1),
                                                                          (1, 1), (0, 0)))],
                  torch=lambda T, a, axes: T.nn.functional.pad(a, _tpad(axes))),
    "conv": OpSpec(lambda x, w, stride, padding: ndl.ops.conv(x, w, stride=stride,
                                                              padding=padding),
                   np_conv,
                   [C((2, 5, 5, 3), (3, 3, 3, 4), stride=1, padding=0),
                    C((2, 5, 5, 3), (3, 3, 3, 4), stride=1, padding=1),
                    C((2, 5, 5, 3), (3, 3, 3, 4), stride=2, padding=0),
                    C((1, 6, 6, 2), (3, 3, 2, 3), stride=2, padding=1),
                    C((1, 7, 7, 2), (3, 3, 2, 2), stride=3, padding=2),
                    C((1, 6, 6, 2), (1, 1, 2, 3), stride=2, padding=0),
                    C((1, 4, 4, 2), (1, 1, 2, 3), stride=1, padding=1),
                    C((1, 5, 5, 1), (2, 2, 1, 2), stride=1, padding=1)],
                   torch=_tconv),
}


def rng_for(*key: Any) -> np.random.Generator:
    """A generator seeded by a stable hash of ``key`` (distinct per op and case)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_inputs(name: str, case: Case) -> List[np.ndarray]:
    """Random float64 inputs for ``case`` following the op's generators."""
    spec = OPS[name]
    rng = rng_for(name, case.shapes, sorted(case.kw.items(), key=str))
    arrays = []
    for i, shape in enumerate(case.shapes):
        gen = spec.gens[i] if i < len(spec.gens) else "normal"
        size = int(np.prod(shape))
        if gen == "normal":
            a = rng.standard_normal(shape)
        elif gen == "positive":
            a = rng.uniform(0.5, 2.0, shape)
        elif gen == "away":  # |a| in [0.5, 2]: safe divisor
            a = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
        elif gen == "distinct":  # pairwise gaps >= 0.1, away from 0 and from other inputs
            a = (rng.permutation(size).reshape(shape) - size / 2) * 0.3 + 0.1 * (i + 1) + 0.01
        else:
            raise ValueError(gen)
        arrays.append(np.asarray(a, dtype=np.float64))
    return arrays
