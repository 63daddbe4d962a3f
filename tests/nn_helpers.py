"""Test utilities for layers: float64 central-difference checks of a Module, torch conversions.

Import with ``from nn_helpers import module_gradcheck, to_torch`` (``pytest.ini`` puts
``tests/`` on the path).
"""
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from helpers import as_list, numerical_grad, weighted_sum

import needle as ndl


def _set(tensor: ndl.Tensor, value: np.ndarray) -> None:
    # through Tensor: the data is an NDArray or a NumPy array, as the backend makes it
    tensor.cached_data = ndl.Tensor(value, device=tensor.device,
                                    dtype=tensor.dtype).realize_cached_data()


def module_gradcheck(fn: Callable[..., Any], module: ndl.nn.Module, inputs: Sequence[np.ndarray],
                     device: Any, consts: Sequence[Any] = (), eps: float = 1e-6,
                     rtol: float = 1e-5, atol: float = 1e-6, seed: int = 0) -> None:
    """Assert the gradients of ``fn(*inputs, *consts)`` w.r.t. the module's parameters and the
    float inputs equal central differences in float64 (the module must hold float64 params)."""
    rng = np.random.default_rng(seed)
    params = module.parameters()
    assert params, "module has no parameters"
    for p in params:
        assert p.dtype == "float64", f"gradcheck needs float64 parameters, got {p.dtype}"
    inputs = [np.asarray(a, dtype=np.float64) for a in inputs]
    xs = [ndl.Tensor(a, device=device, dtype="float64") for a in inputs]
    outs = as_list(fn(*xs, *consts))
    weights = [rng.standard_normal(o.shape) for o in outs]
    loss = None
    for o, w in zip(outs, weights):
        term = (o * ndl.Tensor(w, device=device, dtype="float64")).sum()
        loss = term if loss is None else loss + term
    for p in params:
        p.grad = None
    loss.backward()
    analytic = [p.grad for p in params] + [x.grad for x in xs]
    originals = [p.numpy() for p in params]

    def f(*arrays: np.ndarray) -> float:
        for p, a in zip(params, arrays):
            _set(p, a)
        ts = [ndl.Tensor(a, device=device, dtype="float64", requires_grad=False)
              for a in arrays[len(params):]]
        with ndl.no_grad():
            return weighted_sum([o.numpy() for o in as_list(fn(*ts, *consts))], weights)

    numeric = numerical_grad(f, originals + inputs, eps)
    for p, a in zip(params, originals):
        _set(p, a)
    names = [n for n, _ in module.named_parameters()] + [f"input {i}" for i in range(len(xs))]
    for name, got, want in zip(names, analytic, numeric):
        assert got is not None, f"{name} got no gradient"
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {name}")


def to_torch(t: ndl.Tensor, requires_grad: bool = True) -> Any:
    """A torch leaf tensor with the data of ``t``."""
    import torch
    return torch.tensor(t.numpy(), requires_grad=requires_grad)


def assert_close(needle_value: Any, torch_value: Any, rtol: float = 1e-4, atol: float = 1e-5,
                 msg: str = "") -> None:
    """Compare a needle Tensor/NDArray/array with a torch tensor."""
    a = needle_value.numpy() if hasattr(needle_value, "numpy") else np.asarray(needle_value)
    b = torch_value.detach().numpy() if hasattr(torch_value, "detach") else np.asarray(torch_value)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=msg)


def random_input(*shape: int, device: Any, dtype: str = "float32",
                 rng: Optional[np.random.Generator] = None) -> List[Any]:
    """A needle tensor (requiring grad) and its numpy data."""
    rng = rng if rng is not None else np.random.default_rng(1)
    data = rng.standard_normal(shape).astype(dtype)
    return [ndl.Tensor(data, device=device, dtype=dtype), data]
