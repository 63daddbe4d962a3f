"""needle against PyTorch on random cases: every op (``differential_specs.SPECS``), forward,
backward and result dtypes, float32 and float64 (mixed in binary ops), inputs that are views
(transpose, strided slice, broadcast_to, reshape, chained) with empty and single axes, on
``ndl.cpu()`` and ``ndl.cuda()`` (the emulator where there is no GPU). The device primitives
(``primitives.TABLE``) are checked the same way in ``test_differential_primitives.py``.

Budget: ``NEEDLE_FUZZ_CASES`` cases per op on the CPU (default 200), ``NEEDLE_FUZZ_CUDA_CASES``
on CUDA (default 40: the emulator is slow), from ``NEEDLE_FUZZ_SEED`` (default 0, so ``make
test`` runs the same cases every time); ``make fuzz`` runs many more from a new seed. A
failure names the op, seed and case, and prints the case (dtypes, shapes, views, arguments).

Where needle differs from PyTorch on purpose, the test follows needle's rule:
- names: ``summation(axes)`` is ``sum(dim)``, ``broadcast_to`` is ``expand``/``broadcast_to``,
  ``max(axes)`` is ``amax(dim)``, ``split(a, axis)`` is ``unbind``, ``transpose()`` swaps the
  last two axes; ``conv`` is NHWC with (K, K, C_in, C_out) weights (PyTorch: NCHW, OIHW);
- ``maximum``'s gradient on a tie goes to the first input (PyTorch halves it): the cases draw
  continuous values, so ties have probability zero;
- indexing takes negative slice steps (PyTorch does not): the reference gathers NumPy's
  positions with ``index_select``;
- a 0-d tensor in a binary op promotes like any other tensor (NumPy 2's rule: float32 (3,)
  + float64 () is float64); PyTorch lets a 0-d operand promote like a Python scalar (float32):
  the reference casts its operands to the wider dtype first;
- ``matmul`` and ``conv`` promote mixed float dtypes (the course's hw1 tests matmul float32
  data with float64 weights); PyTorch requires equal dtypes: the reference casts too;
- dropout draws its mask from needle's generator: the reference applies needle's mask;
- dtypes a case never meets here, by design: ``Tensor([1, 2])`` (a Python list) and
  ``Tensor(1.5)`` (a Python float) are float32 and float64 (the course's hw3 and hw1 rules;
  PyTorch: float32 and float32), and layers (``nn.Linear``) cast their input to the weight's
  dtype (PyTorch raises), so they are not ops to compare; the inputs here are typed arrays.
``layer_norm``'s input is drawn without views and with values at least 0.3 apart: rows whose
variance is near eps are ill-conditioned, and there needle's composed float32 backward (the
course's formula, ``fused_ops.layer_norm_backward_naive``) loses more digits than PyTorch's
kernel (relative error 4.6e-4 against PyTorch's 2.7e-5 at a variance near eps; a broadcast
along the normalized axis gives variance 0, where the gradient of an exact 0 comes out near
1e-5 against PyTorch's 0). A known gap, not a tolerance.
Where both refuse a case (``max`` over an empty axis), that is agreement; one refusing alone
is a failure.
"""
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest
from differential_specs import (
    CASES,
    SEED,
    SPECS,
    Draw,
    Spec,
    View,
    apply_view_steps,
    case_rng,
    draw_values,
    view_chain,
)
from helpers import DEVICES, as_list

import needle as ndl

T = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

TOL = {"float32": (2e-4, 2e-5), "float64": (1e-9, 1e-11)}  # (rtol, atol per unit of scale)


def apply_views(x: Any, steps: Sequence[View], torch_side: bool) -> Any:
    """``x`` through ``steps``, with needle's ops or PyTorch's."""
    if torch_side:
        return apply_view_steps(x, steps, lambda t, i, j: t.transpose(i, j))
    return apply_view_steps(x, steps, lambda t, i, j: ndl.ops.transpose(t, (i, j)))


def draw_case(name: str, index: int) -> Dict[str, Any]:
    """One random case of op ``name``: input bases, views, dtypes, keyword arguments, weights."""
    spec = SPECS[name]
    d = Draw(case_rng(name, index))
    shapes, kw = spec.draw(d)
    dtype = d.pick(["float32", "float64"])
    inputs = []
    for i, shape in enumerate(shapes):
        base, steps = view_chain(d, shape, 0 if i in spec.plain else 2)
        kind = spec.values[i] if i < len(spec.values) else "normal"
        inputs.append({"base": draw_values(d.rng, kind, base), "views": steps,
                       "dtype": d.pick(["float32", "float64"]) if spec.mixed else dtype})
    return {"name": name, "index": index, "inputs": inputs, "kw": kw, "rng": d.rng}


def _torch_dtype(name: str) -> Any:
    return getattr(T, name)


def run_needle(spec: Spec, case: Dict[str, Any], device: Any) -> Tuple[List[Any], List[Any]]:
    """needle's outputs and the bases' gradients (of a random weighting of the outputs)."""
    bases = [ndl.Tensor(x["base"], device=device, dtype=x["dtype"]) for x in case["inputs"]]
    args = [apply_views(b, x["views"], False) for b, x in zip(bases, case["inputs"])]
    outs = as_list(spec.nd(*args, **case["kw"]))
    case["weights"] = [case["rng"].standard_normal(o.shape) for o in outs]
    loss = None
    for o, w in zip(outs, case["weights"]):
        term = (o * ndl.Tensor(w, device=device, dtype=o.dtype, requires_grad=False)).sum()
        loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()
    return outs, [b.grad for b in bases]


def run_torch(spec: Spec, case: Dict[str, Any], extra: Dict[str, Any], in_float64: bool = False
              ) -> Tuple[List[Any], List[Any]]:
    """PyTorch's outputs and the bases' gradients, for the same case and weights (with
    ``in_float64``, computed in float64 from the same rounded inputs)."""
    bases = [T.tensor(x["base"].astype(x["dtype"]),
                      dtype=T.float64 if in_float64 else _torch_dtype(x["dtype"]),
                      requires_grad=True) for x in case["inputs"]]
    args = [apply_views(b, x["views"], True) for b, x in zip(bases, case["inputs"])]
    if spec.th_cast:  # needle's promotion where PyTorch's differs (see the docstring)
        wide = T.float64 if any(a.dtype == T.float64 for a in args) else T.float32
        args = [a.to(wide) for a in args]
    outs = as_list(spec.th(T, *args, **case["kw"], **extra))
    terms = [(o * T.from_numpy(w).to(o.dtype)).sum() for o, w in zip(outs, case["weights"])]
    if terms:
        sum(terms).backward()
    return outs, [b.grad for b in bases]


def assert_same(got: Any, want: Any, exact: Any, what: str) -> None:
    """needle's Tensor (None: zeros) has PyTorch's shape and dtype (``want``), and is as close
    to the float64 result ``exact`` as PyTorch's own, within a small tolerance: twice PyTorch's
    error plus rtol/atol (so a float32 cancellation both make is not a failure)."""
    want_np, exact_np = want.detach().numpy(), exact.detach().numpy().astype(np.float64)
    if got is None:
        got_np, dtype = np.zeros_like(want_np), str(want_np.dtype)
    else:
        got_np, dtype = got.numpy(), got.dtype
    assert got_np.shape == want_np.shape, f"{what}: shape {got_np.shape} != {want_np.shape}"
    assert dtype == str(want.dtype).replace("torch.", ""), f"{what}: dtype {dtype} != {want.dtype}"
    rtol, atol = TOL[dtype]
    scale = float(np.max(np.abs(exact_np[np.isfinite(exact_np)]), initial=1.0))
    got64 = got_np.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        allowed = 2 * np.abs(want_np - exact_np) + rtol * np.abs(exact_np) + atol * scale
        close = (got64 == exact_np) | (np.abs(got64 - exact_np) <= allowed)
    close |= np.isnan(got64) & np.isnan(exact_np)
    if not close.all():
        bad = tuple(np.argwhere(~close)[0]) if got_np.ndim else ()
        raise AssertionError(f"{what}: {int((~close).sum())} of {close.size} elements differ; "
                             f"at {bad}: needle {got_np[bad]}, PyTorch {want_np[bad]}, "
                             f"float64 {exact_np[bad]}")


def describe(case: Dict[str, Any]) -> str:
    """The case, for a failure message."""
    inputs = [(x["dtype"], x["base"].shape, x["views"]) for x in case["inputs"]]
    return (f"{case['name']} case {case['index']} (NEEDLE_FUZZ_SEED={SEED}): inputs (dtype, "
            f"base shape, views) {inputs}, kw {case['kw']}")


def check_case(name: str, index: int, device: Any) -> None:
    """needle and PyTorch agree on one random case of op ``name``: values, dtypes, gradients."""
    spec = SPECS[name]
    case = draw_case(name, index)
    try:
        outs, grads = run_needle(spec, case, device)
    except Exception as needle_error:  # agreement when PyTorch refuses the case too
        case.setdefault("weights", [])
        try:
            run_torch(spec, case, {})
        except Exception:
            return
        raise AssertionError(f"needle raised {needle_error!r}, PyTorch did not: "
                             f"{describe(case)}") from needle_error
    extra = spec.th_kw(outs) if spec.th_kw is not None else {}
    t_outs, t_grads = run_torch(spec, case, extra)
    x_outs, x_grads = run_torch(spec, case, extra, in_float64=True)
    assert len(outs) == len(t_outs), f"{len(outs)} outputs, PyTorch {len(t_outs)}"
    try:
        for i, (o, t, x) in enumerate(zip(outs, t_outs, x_outs)):
            assert_same(o, t, x, f"output {i}")
        for i, (g, t, x) in enumerate(zip(grads, t_grads, x_grads)):
            if t is not None or g is not None:
                assert t is not None, f"input {i}: needle has a gradient, PyTorch none"
                assert_same(g, t, x, f"gradient of input {i}")
    except AssertionError as e:
        raise AssertionError(f"{describe(case)}\n{e}") from None


def _device_name(device: Any) -> str:
    return "cuda" if device == ndl.cuda() else "cpu"


# mean over an empty axis is nan and logsumexp of one -inf, in both: NumPy warns about them
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_op_agrees_with_torch(name: str, device: Any) -> None:
    if _device_name(device) not in SPECS[name].devices:
        pytest.skip(f"{name} is a {'/'.join(SPECS[name].devices)} kernel only")
    for index in range(CASES[_device_name(device)]):
        check_case(name, index, device)


def _op_classes() -> List[str]:
    return sorted(n for n, c in vars(ndl.ops).items() if isinstance(c, type)
                  and issubclass(c, ndl.autograd.Op) and c.__module__.startswith("needle.ops"))


def test_every_op_class_has_a_spec() -> None:
    """Adding an op to needle.ops without a differential spec fails here."""
    listed = {c for spec in SPECS.values() for c in spec.classes}
    assert sorted(set(_op_classes()) - listed) == []
    assert sorted(listed - set(_op_classes())) == []
