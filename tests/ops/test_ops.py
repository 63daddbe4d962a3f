"""Every op: forward against NumPy, gradient against float64 central differences and PyTorch.

``OPS`` (``op_table.py``) lists each op once (needle callable, NumPy reference, optional torch
reference, input generators, cases); the tests parametrize over op x case x device.
"""
from typing import Any, List, Sequence

import numpy as np
import pytest
from helpers import DEVICES, as_list, check_op_gradient, input_gradients
from op_table import OPS, Case, make_inputs, np_conv, rng_for

import needle as ndl
from needle.backend_ndarray import to_numpy_dtype


def _params(with_torch: bool = False) -> List[Any]:
    params = []
    for name, spec in OPS.items():
        if with_torch and spec.torch is None:
            continue
        for case in spec.cases:
            kw = ",".join(f"{k}={v}" for k, v in case.kw.items())
            shapes = "_".join("x".join(map(str, s)) or "scalar" for s in case.shapes)
            params.append(pytest.param(name, case, id=f"{name}-{shapes}-{kw}".rstrip("-")))
    return params


def _run(name: str, case: Case, arrays: Sequence[np.ndarray], device: Any, dtype: str) -> List:
    tensors = [ndl.Tensor(a, device=device, dtype=dtype) for a in arrays]
    return as_list(OPS[name].fn(*tensors, **case.kw))


@pytest.mark.forward
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,case", _params())
def test_forward_matches_numpy(name: str, case: Case, device: Any, dtype: str) -> None:
    arrays = make_inputs(name, case)
    outs = _run(name, case, arrays, device, dtype)
    refs = as_list(OPS[name].ref(*[a.astype(dtype) for a in arrays], **case.kw))
    assert len(outs) == len(refs)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for out, ref in zip(outs, refs):
        assert out.shape == np.shape(ref)
        assert out.dtype == dtype
        assert out.device == device
        np.testing.assert_allclose(out.numpy(), ref, rtol=tol, atol=tol)


LOW_PRECISION_OPS = ["add", "multiply", "divide", "exp", "tanh", "sigmoid", "relu", "matmul",
                     "summation", "max", "logsumexp", "logsoftmax", "softmax", "conv"]


@pytest.mark.forward
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LOW_PRECISION_OPS)
def test_forward_low_precision(name: str, device: Any, dtype: str) -> None:
    """Half-precision dtypes are kept, and values stay within a few ulps of float64."""
    case = OPS[name].cases[1]
    arrays = [a.astype(to_numpy_dtype(dtype)).astype(np.float64)  # representable inputs
              for a in make_inputs(name, case)]
    outs = _run(name, case, arrays, device, dtype)
    refs = as_list(OPS[name].ref(*arrays, **case.kw))
    eps = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    for out, ref in zip(outs, refs):
        assert out.dtype == dtype and out.shape == np.shape(ref)
        scale = max(1.0, float(np.max(np.abs(ref))))
        np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=8 * eps,
                                   atol=8 * eps * scale)


@pytest.mark.backward
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,case", _params())
def test_gradient_matches_central_differences(name: str, case: Case, device: Any) -> None:
    spec = OPS[name]
    check_op_gradient(lambda *ts: spec.fn(*ts, **case.kw), lambda *xs: spec.ref(*xs, **case.kw),
                      make_inputs(name, case), device, rng=rng_for("weights", name, case.shapes))


@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,case", _params(with_torch=True))
def test_forward_and_gradient_match_torch(name: str, case: Case, device: Any) -> None:
    T = pytest.importorskip("torch")
    spec = OPS[name]
    arrays = make_inputs(name, case)
    tensors = [ndl.Tensor(a, device=device, dtype="float64") for a in arrays]
    t_tensors = [T.tensor(a, dtype=T.float64, requires_grad=True) for a in arrays]
    outs = as_list(spec.fn(*tensors, **case.kw))
    t_outs = as_list(spec.torch(T, *t_tensors, **case.kw))
    rng = rng_for("torch-weights", name, case.shapes)
    weights = [rng.standard_normal(tuple(o.shape)) for o in t_outs]
    for out, t_out in zip(outs, t_outs):
        np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-10, atol=1e-10)
    grads = input_gradients(outs, tensors, weights, device)
    t_loss = sum((o * T.from_numpy(w)).sum() for o, w in zip(t_outs, weights))
    t_loss.backward()
    for g, tt in zip(grads, t_tensors):
        np.testing.assert_allclose(g.numpy(), tt.grad.numpy(), rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------------- special cases
@pytest.mark.parametrize("device", DEVICES)
def test_max_with_ties_shares_the_gradient(device: Any) -> None:
    x = ndl.Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [5.0, 5.0, 5.0]]), device=device,
                   dtype="float64")
    ndl.ops.max(x, axes=1).sum().backward()
    # the subgradient torch.amax uses: the adjoint split evenly among the tied maxima
    expected = np.array([[0, 0.5, 0.5], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)
    x2 = ndl.Tensor(np.full((2, 2), 7.0), device=device, dtype="float64")
    ndl.ops.max(x2).backward()
    np.testing.assert_allclose(x2.grad.numpy(), np.full((2, 2), 0.25))


@pytest.mark.torch
def test_max_ties_match_torch_amax() -> None:
    T = pytest.importorskip("torch")
    a = np.array([[[1.0, 4.0], [4.0, 0.0]], [[2.0, 2.0], [2.0, -1.0]]])
    x = ndl.Tensor(a, dtype="float64")
    tx = T.tensor(a, requires_grad=True)
    w = np.arange(2.0) + 1
    (ndl.ops.max(x, axes=(1, 2)) * ndl.Tensor(w, dtype="float64")).sum().backward()
    (T.amax(tx, dim=(1, 2)) * T.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@pytest.mark.logsumexp
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_logsoftmax_stable_for_large_inputs(device: Any, dtype: str) -> None:
    a = np.array([[1e4, 1e4 + 1, 1e4 - 2], [-1e4, 0.0, 1e4], [-1e4, -1e4 - 1, -1e4]])
    x = ndl.Tensor(a, device=device, dtype=dtype)
    lse = ndl.ops.logsumexp(x, axes=(1,))
    m = a.max(axis=1)
    expected = m + np.log(np.exp(a - m[:, None]).sum(axis=1))  # the stable formula, in float64
    assert np.all(np.isfinite(lse.numpy()))
    np.testing.assert_allclose(lse.numpy(), expected, rtol=1e-6)
    lse.sum().backward()
    softmax = np.exp(a - expected[:, None])
    # float32 holds 1e4 only to ~1e-3 absolute, so exp(z - lse) is good to ~1e-3 relative
    tol = 2e-3 if dtype == "float32" else 1e-9
    assert np.all(np.isfinite(x.grad.numpy()))
    np.testing.assert_allclose(x.grad.numpy(), softmax, rtol=tol, atol=1e-6)
    y = ndl.Tensor(a, device=device, dtype=dtype)
    ls = ndl.ops.logsoftmax(y)
    np.testing.assert_allclose(ls.numpy(), a - expected[:, None], rtol=1e-6, atol=1e-3)
    ls.sum().backward()
    assert np.all(np.isfinite(y.grad.numpy()))
    np.testing.assert_allclose(y.grad.numpy(), 1 - 3 * softmax, rtol=tol, atol=3 * tol)
    sm = ndl.ops.softmax(ndl.Tensor(a, device=device, dtype=dtype))
    np.testing.assert_allclose(sm.numpy(), softmax, rtol=tol, atol=1e-7)
    sig = ndl.ops.sigmoid(ndl.Tensor(np.array([-1e4, 0.0, 1e4]), device=device, dtype=dtype))
    np.testing.assert_allclose(sig.numpy(), [0.0, 0.5, 1.0])


@pytest.mark.parametrize("src,dst", [("float32", "float64"), ("float64", "float32"),
                                     ("float32", "float16"), ("float32", "bfloat16"),
                                     ("float64", "int32"), ("float32", "int64"),
                                     ("float32", "bool")])
def test_cast_forward(src: str, dst: str) -> None:
    a = np.array([[-2.0, 0.0, 1.5], [3.0, 0.25, -0.75]], dtype=src)
    y = ndl.ops.cast(ndl.Tensor(a, dtype=src), dst)
    assert y.dtype == dst
    np.testing.assert_array_equal(y.numpy(), a.astype(to_numpy_dtype(dst)))
    assert y.requires_grad == (dst not in ("int32", "int64", "bool"))


@pytest.mark.parametrize("src,dst", [("float32", "float64"), ("float64", "float32"),
                                     ("float32", "bfloat16")])
def test_cast_gradient_returns_to_input_dtype(src: str, dst: str) -> None:
    x = ndl.Tensor(np.array([1.0, -2.0, 3.0]), dtype=src)
    w = np.array([0.5, -1.0, 2.0])
    (ndl.ops.cast(x, dst) * ndl.Tensor(w, dtype=dst)).sum().backward()
    assert x.grad.dtype == src
    np.testing.assert_allclose(x.grad.numpy(), w)
    assert ndl.ops.cast(x, src) is x  # a no-op cast adds no node


@pytest.mark.stack_split
def test_stack_split_round_trip() -> None:
    xs = [np.random.randn(2, 3) for _ in range(4)]
    for axis in (0, 1, 2, -1):
        st = ndl.ops.stack([ndl.Tensor(x) for x in xs], axis)
        parts = ndl.ops.split(st, axis)
        assert len(parts) == 4
        for p, x in zip(parts, xs):
            np.testing.assert_allclose(p.numpy(), x.astype(np.float32))


@pytest.mark.conv
def test_dilate_undilate_are_inverse() -> None:
    x = np.random.randn(2, 3, 4)
    for axes, d in (((0,), 1), ((1, 2), 2), ((0, 1, 2), 3)):
        y = ndl.ops.undilate(ndl.ops.dilate(ndl.Tensor(x), axes, d), axes, d)
        np.testing.assert_allclose(y.numpy(), x.astype(np.float32))


@pytest.mark.conv
def test_np_conv_reference_matches_naive_loop() -> None:
    """The direct-loop reference itself against the definition, element by element."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 5, 4, 2)), rng.standard_normal((3, 3, 2, 2))
    s, p = 2, 1
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    ref = np_conv(x, w, stride=s, padding=p)
    assert ref.shape == (1, 3, 2, 2)
    for i in range(ref.shape[1]):
        for j in range(ref.shape[2]):
            for o in range(2):
                val = sum(xp[0, i * s + di, j * s + dj, c] * w[di, dj, c, o]
                          for di in range(3) for dj in range(3) for c in range(2))
                assert abs(ref[0, i, j, o] - val) < 1e-12
    out = ndl.ops.conv(ndl.Tensor(x, dtype="float64"), ndl.Tensor(w, dtype="float64"),
                       stride=s, padding=p)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)


def test_second_order_gradient_of_ops() -> None:
    """d/dx of sum(d/dx sum(f(x))) for a few ops, against analytic second derivatives."""
    a = np.array([0.3, 1.2, 2.0])
    cases = [(lambda t: ndl.ops.exp(t), np.exp),
             (lambda t: ndl.ops.log(t), lambda v: -1 / v ** 2),
             (lambda t: ndl.ops.power_scalar(t, 3), lambda v: 6 * v),
             (lambda t: ndl.ops.tanh(t), lambda v: -2 * np.tanh(v) * (1 - np.tanh(v) ** 2)),
             (lambda t: t / ndl.Tensor(np.full(3, 2.0), dtype="float64") * t,
              lambda v: np.full_like(v, 1.0))]
    for f, d2 in cases:
        x = ndl.Tensor(a, dtype="float64")
        f(x).sum().backward()
        g = x.grad
        g.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), d2(a), rtol=1e-10)


# ---------------------------------------------------------------------- course API
COURSE_CLASSES = ["EWiseAdd", "AddScalar", "EWiseMul", "MulScalar", "EWisePow", "PowerScalar",
                  "EWiseDiv", "DivScalar", "Negate", "Log", "Exp", "ReLU", "Tanh", "Transpose",
                  "Reshape", "BroadcastTo", "Summation", "MatMul", "LogSoftmax", "LogSumExp",
                  "Stack", "Split", "Flip", "Dilate", "UnDilate", "Conv", "MakeTensorTuple",
                  "TupleGetItem", "FusedAddScalars"]
COURSE_FUNCTIONS = ["add", "add_scalar", "multiply", "mul_scalar", "power", "power_scalar",
                    "divide", "divide_scalar", "negate", "log", "exp", "relu", "tanh", "sigmoid",
                    "transpose", "reshape", "broadcast_to", "summation", "matmul", "logsoftmax",
                    "logsumexp", "stack", "split", "flip", "dilate", "undilate", "conv",
                    "make_tuple", "tuple_get_item", "fused_add_scalars", "softmax", "maximum",
                    "max", "where", "cast", "pad", "mean", "get_item"]


def test_course_op_names_exist() -> None:
    for name in COURSE_CLASSES:
        cls = getattr(ndl.ops, name)
        assert issubclass(cls, (ndl.autograd.TensorOp, ndl.autograd.TensorTupleOp)), name
    for name in COURSE_FUNCTIONS:
        assert callable(getattr(ndl.ops, name)), name
    for name in ("add", "summation", "matmul", "relu", "logsumexp"):
        assert getattr(ndl, name) is getattr(ndl.ops, name)  # `from .ops import *`


def test_course_keyword_signatures() -> None:
    """The keyword names the course's homework tests pass."""
    x = ndl.Tensor(np.arange(24.0).reshape(2, 3, 4))
    assert ndl.ops.summation(x, axes=(0, 2)).shape == (3,)
    assert ndl.ops.transpose(x, axes=(0, 1)).shape == (3, 2, 4)
    assert ndl.ops.reshape(x, shape=(6, 4)).shape == (6, 4)
    assert ndl.ops.broadcast_to(ndl.Tensor(np.ones((3, 1))), shape=(3, 4)).shape == (3, 4)
    assert ndl.ops.logsumexp(x, axes=(1,)).shape == (2, 4)
    assert ndl.ops.stack([x, x], axis=1).shape == (2, 2, 3, 4)
    assert len(ndl.ops.split(x, axis=2)) == 4
    assert ndl.ops.flip(x, axes=(0,)).shape == (2, 3, 4)
    assert ndl.ops.dilate(x, axes=(1,), dilation=1).shape == (2, 6, 4)
    assert ndl.ops.undilate(x, axes=(2,), dilation=1).shape == (2, 3, 2)
    w = ndl.Tensor(np.ones((3, 3, 4, 5)))
    assert ndl.ops.conv(x.reshape((1, 2, 3, 4)), w, stride=1, padding=1).shape == (1, 2, 3, 5)
    assert ndl.ops.power_scalar(x, 2).shape == x.shape
    assert ndl.ops.EWiseAdd()(x, x).shape == x.shape
    assert ndl.ops.Summation(axes=(0,))(x).shape == (3, 4)
