"""Every backend implements the primitives declared in ``primitives.py``, with their parameters.

The CUDA backend imports CuPy, which CI machines lack, so it is read as source (``ast``) and
compared with the declarations: a primitive NDArray calls but the GPU backend lacks (or takes
different arguments) fails here, on any machine, instead of on the first GPU run. Where the
CUDA emulator (or a GPU) gives an ``ndl.cuda()`` device, its bound primitives are checked too.
"""
import ast
import inspect
from pathlib import Path

import pytest

import needle as ndl
import needle.backend_ndarray.ndarray_backend_numpy as numpy_backend
from needle.backend_cuda import kernel_specs
from needle.backend_ndarray import primitives

CUDA_SRC = Path(numpy_backend.__file__).resolve().parents[1] / "backend_cuda" / \
    "ndarray_backend_cuda.py"


def _cuda_module() -> ast.Module:
    return ast.parse(CUDA_SRC.read_text())


def _cuda_functions() -> dict:
    """Top-level ``def``s of the CUDA backend: name -> [(parameter, default source or None)]."""
    out = {}
    for node in _cuda_module().body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            defaults = [None] * (len(args.args) - len(args.defaults)) + [
                ast.unparse(d) for d in args.defaults]
            out[node.name] = [(a.arg, d) for a, d in zip(args.args, defaults)]
    return out


def _cuda_exported() -> set:
    """The string names listed in the CUDA backend's ``_PRIMITIVES.update(...)`` calls."""
    names = set()
    for node in ast.walk(_cuda_module()):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "_PRIMITIVES.update":
            names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                      and isinstance(c.value, str)}
    return names


def _numpy_params(name: str) -> list:
    sig = inspect.signature(getattr(numpy_backend, name))
    return [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in sig.parameters.values()]


@pytest.mark.parametrize("name", numpy_backend.PRIMITIVES)
def test_cuda_backend_defines_and_exports_each_primitive(name):
    assert name in _cuda_functions(), f"CUDA backend has no {name}()"
    assert name in _cuda_exported(), f"CUDA backend does not bind {name} to its devices"


@pytest.mark.parametrize("name", numpy_backend.PRIMITIVES)
def test_primitive_parameters_agree(name):
    assert _cuda_functions()[name] == _numpy_params(name), (
        f"{name}: CUDA takes {_cuda_functions()[name]}, NumPy takes {_numpy_params(name)}")
    declared = primitives.TABLE[name].params
    assert tuple(p for p, _ in _numpy_params(name)) == declared, (name, declared)


def test_cuda_covers_every_elementwise_op():
    """ewise.cu's source defines each op's functor and instantiates its kernels."""
    src, names = kernel_specs.source("ewise.cu"), kernel_specs.name_expressions("ewise.cu")
    for name, p in primitives.TABLE.items():
        if p.family:
            assert f"struct {p.op.capitalize()} {{" in src, name
            assert all(kernel_specs.elementwise_name(p, dt) in names
                       for dt in kernel_specs.FLOAT_DTYPES), name


def _devices():
    cuda = ndl.cuda()
    return [ndl.cpu()] + ([cuda] if cuda.enabled() else [])


@pytest.mark.parametrize("name", primitives.REQUIRED)
def test_every_device_implements_each_declared_primitive(name):
    """Each required primitive, the ewise_/scalar_ families included, is bound on every device
    with the declared parameters (names, in order)."""
    want = primitives.TABLE[name].params
    for device in _devices():
        fn = getattr(device, name, None)
        assert fn is not None, f"{device} has no primitive {name}"
        got = tuple(inspect.signature(fn).parameters)
        assert got == want, f"{device}.{name} takes {got}, declared {want}"


def test_declarations_are_consistent():
    """Each read and write names a parameter; elementwise ops have an expression."""
    for name, p in primitives.TABLE.items():
        for pos, view in p.reads:
            assert 0 <= pos < p.arity, (name, pos)
            spec = () if view is None else (view,) if isinstance(view, int) else view
            assert all(0 <= k < p.arity for k in spec), (name, view)
        assert -1 <= p.write < p.arity, name
        if p.family:
            assert p.elementwise and p.expr is not None, name
    assert primitives.lookup("not_a_primitive") is None


def test_every_numpy_primitive_is_listed_in_the_contract():
    """The contract list itself is complete: no public NumPy primitive is missing from it."""
    helpers = {"Array", "Any", "Callable", "Dict", "Iterable", "Sequence", "Tuple",
               "elementwise_functions", *numpy_backend.OPTIONAL_PRIMITIVES}
    public = {n for n, v in vars(numpy_backend).items() if callable(v) and not n.startswith("_")
              and n not in helpers and not n.startswith(("ewise_", "scalar_"))}
    assert public <= set(numpy_backend.PRIMITIVES) | {"np"}, public - set(
        numpy_backend.PRIMITIVES)
