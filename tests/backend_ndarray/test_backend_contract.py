"""Every backend implements the same named primitives with the same parameters.

The CUDA backend imports CuPy, which CI machines lack, so it is read as source (``ast``) and
compared with the NumPy backend's contract: a primitive NDArray calls but the GPU backend lacks
(or takes different arguments) fails here, on any machine, instead of on the first GPU run.
"""
import ast
import inspect
from pathlib import Path

import pytest

import needle.backend_ndarray.ndarray_backend_numpy as numpy_backend
from needle.backend_cuda import kernel_specs

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


def test_cuda_covers_every_elementwise_op():
    assert set(numpy_backend.EWISE_BINARY) <= set(kernel_specs.BINARY_FUNCTOR)
    assert set(numpy_backend.EWISE_UNARY) <= set(kernel_specs.UNARY_FUNCTOR)


def test_every_numpy_primitive_is_listed_in_the_contract():
    """The contract list itself is complete: no public NumPy primitive is missing from it."""
    helpers = {"Array", "Any", "Sequence", "Tuple", *numpy_backend.OPTIONAL_PRIMITIVES}
    public = {n for n, v in vars(numpy_backend).items() if callable(v) and not n.startswith("_")
              and n not in helpers and not n.startswith(("ewise_", "scalar_"))}
    assert public <= set(numpy_backend.PRIMITIVES) | {"np"}, public - set(
        numpy_backend.PRIMITIVES)
