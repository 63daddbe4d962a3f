"""The device primitives (``primitives.TABLE``) against PyTorch on random cases: each reached
through ``NDArray`` (the primitives' one caller) with views as operands (transpose, strided
slice, broadcast_to, reshape), empty and single axes, float32 and float64, on ``ndl.cpu()`` and
``ndl.cuda()`` (the emulator where there is no GPU). Seeds and budget as in
``test_differential.py`` (``NEEDLE_FUZZ_SEED``, ``NEEDLE_FUZZ_CASES``,
``NEEDLE_FUZZ_CUDA_CASES``). Values must equal PyTorch's in the same dtype within a few ulps;
comparisons and setitem exactly.
"""
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np
import pytest
from differential_specs import (
    CASES,
    Draw,
    Shape,
    apply_view_steps,
    case_rng,
    draw_values,
    view_chain,
)
from helpers import DEVICES

import needle as ndl
from needle.backend_ndarray import functions as F
from needle.backend_ndarray import primitives

T = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
TOL = {"float32": 3e-6, "float64": 1e-13}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
          "maximum": lambda a, b: a.maximum(b) if isinstance(a, ndl.NDArray) else T.maximum(
              a, b if isinstance(b, T.Tensor) else T.tensor(b, dtype=a.dtype)),
          "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
          "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
UNARY = {"neg": lambda a: -a, "log": lambda a: a.log(), "exp": lambda a: a.exp(),
         "tanh": lambda a: a.tanh(), "sqrt": lambda a: a.sqrt(), "abs": lambda a: a.abs(),
         "sin": lambda a: a.sin(), "cos": lambda a: a.cos()}
# optional primitives reached by other tests: where
ELSEWHERE = {"ewise_strided": "the binary checks here (operands are views)",
             "matmul_tiled": "the matmul check here (8 x 8 x 8 on a tiled device)",
             "fused_elementwise": "tests/compiler/test_compile_fuzz.py",
             "softmax_rows": "test_differential.py (softmax on cuda)",
             "logsumexp_rows": "test_differential.py (logsumexp on cuda)",
             "layer_norm_fwd": "test_differential.py (layer_norm on cuda)",
             "layer_norm_bwd": "test_differential.py (layer_norm on cuda)",
             "dropout": "test_differential.py (dropout on cuda)",
             "dropout_backward": "test_differential.py (dropout on cuda)",
             **dict.fromkeys(("conv_im2col", "conv_col2im", "conv_bias_add", "column_sum",
                              "batch_norm_fwd", "batch_norm_bwd"),
                             "tests/backend_cuda/test_cuda_conv_bn.py (against the course's "
                             "conv and batch norm, and central differences)")}


def _swap(x: Any, i: int, j: int) -> Any:
    """Axes i and j swapped: NDArray's permute, or PyTorch's transpose."""
    if not isinstance(x, ndl.NDArray):
        return x.transpose(i, j)
    order = list(range(x.ndim))
    order[i], order[j] = order[j], order[i]
    return x.permute(tuple(order))


def ndarray_views(x: Any, steps: Sequence[Tuple[Any, ...]]) -> Any:
    """``x`` (an NDArray or a torch tensor) through view steps, NDArray's way or PyTorch's."""
    return apply_view_steps(x, steps, _swap)


def operand(d: Draw, shape: Shape, dtype: str, device: Any, kind: str = "normal"
            ) -> Tuple[Any, Any]:
    """The same values as an NDArray (maybe a view) and a torch tensor of ``shape``."""
    base, steps = view_chain(d, shape)
    values = np.array(draw_values(d.rng, kind, base), dtype=dtype)  # 0-d stays an array
    return (ndarray_views(ndl.NDArray(values, device=device), steps),
            ndarray_views(T.from_numpy(values), steps))


def assert_equal(got: Any, want: Any, what: str) -> None:
    """An NDArray equals a torch tensor in shape, dtype and values (a few ulps for floats)."""
    want_np = want.numpy() if isinstance(want, T.Tensor) else np.asarray(want)
    assert got.shape == want_np.shape, f"{what}: shape {got.shape} != {want_np.shape}"
    assert got.dtype == str(want_np.dtype), f"{what}: dtype {got.dtype} != {want_np.dtype}"
    tol = TOL.get(got.dtype, 0)
    np.testing.assert_allclose(got.numpy(), want_np, rtol=tol, atol=tol, equal_nan=True,
                               err_msg=what)


def check_binary(d: Draw, device: Any, dtype: str, op: str) -> None:
    out = d.shape()
    kind = "positive" if op == "pow" else "away"  # no division by zero, real powers
    a, ta = operand(d, d.broadcastable(out), dtype, device, kind)
    b, tb = operand(d, d.broadcastable(out), dtype, device, "normal" if op == "pow" else kind)
    if op in primitives.COMPARISONS and d.rng.random() < 0.5:
        b, tb = a, ta  # equal operands: the comparisons' ties
    assert_equal(BINARY[op](a, b), BINARY[op](ta, tb), f"ewise_{op}")
    s = float(d.pick([0.5, -1.5, 2.0]))
    assert_equal(BINARY[op](a, s), BINARY[op](ta, s), f"scalar_{op} {s}")


def check_unary(d: Draw, device: Any, dtype: str, op: str) -> None:
    a, ta = operand(d, d.shape(), dtype, device, "positive" if op in ("log", "sqrt") else "normal")
    assert_equal(UNARY[op](a), UNARY[op](ta), f"ewise_{op}")


def check_memory(d: Draw, device: Any, dtype: str) -> None:
    """fill, compact, ewise_setitem, scalar_setitem, astype, from_numpy and to_numpy."""
    shape = d.shape(1, 4)
    a, ta = operand(d, shape, dtype, device)
    assert_equal(a.compact(), ta.contiguous(), "compact")
    assert_equal(F.full(shape, 2.5, dtype, device), T.full(shape, 2.5, dtype=ta.dtype), "fill")
    other = "float64" if dtype == "float32" else "float32"
    assert_equal(a.astype(other), ta.to(getattr(T, other)), "ewise_astype")
    assert_equal((a > 0).astype(dtype), (ta > 0).to(ta.dtype), "ewise_astype from bool")
    target, t_target = operand(d, shape, dtype, device)
    target, t_target = target.compact(), t_target.clone()
    idx = tuple(slice(d.int(0, 1), None, d.int(1, 2)) for _ in shape)
    src, t_src = operand(d, tuple(t_target[idx].shape), dtype, device)
    target[idx] = src
    t_target[idx] = t_src
    assert_equal(target, t_target, "ewise_setitem")
    target[idx] = -3.0
    t_target[idx] = -3.0
    assert_equal(target, t_target, "scalar_setitem")


def check_where(d: Draw, device: Any, dtype: str) -> None:
    out = d.shape()
    a, ta = operand(d, d.broadcastable(out), dtype, device)
    b, tb = operand(d, d.broadcastable(out), dtype, device)
    cond = np.asarray(d.rng.random(d.broadcastable(out)) < 0.5)
    assert_equal(F.where(ndl.NDArray(cond, device=device), a, b),
                 T.where(T.from_numpy(cond), ta, tb), "ewise_where")


def check_matmul(d: Draw, device: Any, dtype: str) -> None:
    sizes = (0, 1, 2, 3, 8)
    m, n, p = d.pick(sizes), d.pick(sizes), d.pick(sizes)
    batch = d.shape(0, 2)
    a, ta = operand(d, d.broadcastable(batch) + (m, n), dtype, device)
    b, tb = operand(d, d.broadcastable(batch) + (n, p) if d.rng.random() < 0.5 else (n, p),
                    dtype, device)
    got, want = a @ b, ta @ tb
    scale = max(1.0, float(np.abs(want.numpy()).max(initial=0)))
    assert got.shape == tuple(want.shape) and got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=TOL[dtype] * 10,
                               atol=TOL[dtype] * 10 * scale * n, err_msg="matmul")


def check_reduce(d: Draw, device: Any, dtype: str) -> None:
    shape = d.shape(0, 4)
    a, ta = operand(d, shape, dtype, device)
    axes, keep = d.axes(len(shape)), bool(d.pick([False, True]))
    dims = tuple(range(len(shape))) if axes is None else axes
    want = ta.sum(dim=dims, keepdim=keep) if shape else ta
    scale = max(1, int(np.prod(shape)))
    np.testing.assert_allclose(a.sum(axes, keep).numpy(), want.numpy(), rtol=TOL[dtype] * scale,
                               atol=TOL[dtype] * scale, err_msg="reduce_sum")
    dims_t = (dims,) if isinstance(dims, int) else dims
    if all(shape[i] > 0 for i in dims_t):
        want = T.amax(ta, dim=dims, keepdim=keep) if shape else ta
        assert_equal(a.max(axes, keep), want, "reduce_max")


def check_rows(d: Draw, device: Any, dtype: str) -> None:
    rows, cols = d.int(1, 5), d.pick((0, 1, 3))
    table, t_table = operand(d, (rows, cols), dtype, device)
    idx = d.rng.integers(0, rows, d.shape(0, 2))
    nd_idx = ndl.NDArray(idx.astype(np.int64), device=device)
    assert_equal(F.take_rows(table, nd_idx), t_table[T.from_numpy(idx)], "take_rows")
    src, t_src = operand(d, idx.shape + (cols,), dtype, device)
    want = T.zeros((rows, cols), dtype=t_src.dtype).index_add(
        0, T.from_numpy(idx.reshape(-1)), t_src.reshape(idx.size, cols))
    assert_equal(F.scatter_add_rows(src, nd_idx, rows), want, "scatter_add_rows")


CHECKS: Dict[str, Tuple[Callable[..., None], Tuple[str, ...]]] = {
    **{f"binary_{op}": (lambda d, dev, dt, op=op: check_binary(d, dev, dt, op),
                        (f"ewise_{op}", f"scalar_{op}")) for op in BINARY},
    **{f"unary_{op}": (lambda d, dev, dt, op=op: check_unary(d, dev, dt, op), (f"ewise_{op}",))
       for op in UNARY},
    "memory": (check_memory, ("fill", "compact", "ewise_setitem", "scalar_setitem",
                              "ewise_astype", "from_numpy", "to_numpy")),
    "where": (check_where, ("ewise_where",)),
    "matmul": (check_matmul, ("matmul",)),
    "reduce": (check_reduce, ("reduce_sum", "reduce_max")),
    "rows": (check_rows, ("take_rows", "scatter_add_rows")),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", sorted(CHECKS))
def test_primitive_agrees_with_torch(group: str, device: Any) -> None:
    check = CHECKS[group][0]
    for index in range(CASES["cuda" if device == ndl.cuda() else "cpu"]):
        d = Draw(case_rng("primitive", group, index))
        dtype = d.pick(["float32", "float64"])
        try:
            check(d, device, dtype)
        except AssertionError as e:
            raise AssertionError(f"{group} case {index} ({dtype}): {e}") from None


def test_every_primitive_is_checked() -> None:
    """A primitive added to the table without a check (here or named in ELSEWHERE) fails."""
    checked = {name for _, names in CHECKS.values() for name in names}
    assert sorted(set(primitives.TABLE) - checked - set(ELSEWHERE)) == []
    assert sorted((checked | set(ELSEWHERE)) - set(primitives.TABLE)) == []
