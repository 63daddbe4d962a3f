"""Shared test utilities: the device list, float64 central-difference gradients and the dropout
kernel's uniforms in NumPy.

Import from any test module with ``from helpers import DEVICES, numerical_grad`` (``pytest.ini``
puts ``tests/`` on the path).
"""
import contextlib
import faulthandler
import signal
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import needle as ndl

DEVICES = [
    pytest.param(ndl.cpu(), id="cpu"),
    pytest.param(ndl.cuda(), id="cuda", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not ndl.cuda().enabled(),
                           reason="no GPU (NEEDLE_CUDA_EMULATOR=1 runs the emulator instead)"),
    ]),
]


def numerical_grad(f: Callable[..., float], arrays: Sequence[np.ndarray],
                   eps: float = 1e-6) -> List[np.ndarray]:
    """Central-difference gradient of the scalar ``f(*arrays)`` w.r.t. each array, in float64."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        flat, gflat = a.reshape(-1), g.reshape(-1)  # views: writes go into a and g
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            plus = float(f(*arrays))
            flat[i] = old - eps
            minus = float(f(*arrays))
            flat[i] = old
            gflat[i] = (plus - minus) / (2 * eps)
        grads.append(g)
    return grads


def as_list(out: Any) -> List[Any]:
    """An op's output as a list (a TensorTuple, tuple or list is spread, a single value wrapped)."""
    if isinstance(out, ndl.TensorTuple):
        return [out[i] for i in range(len(out))]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def weighted_sum(outs: Sequence[np.ndarray], weights: Sequence[np.ndarray]) -> float:
    """sum_i <outs[i], weights[i]>: a scalar loss whose gradient reaches every output element."""
    return float(sum(np.sum(np.asarray(o, dtype=np.float64) * w) for o, w in zip(outs, weights)))


def _direct_partials(outs: Sequence[Any], tensors: Sequence[Any], weights: Sequence[Any]
                     ) -> Optional[List[Any]]:
    """The op's own ``gradient`` applied to ``weights`` when ``outs`` is one op of ``tensors``
    (partials of an input used twice added up); None when it is not."""
    if len(outs) != 1 or outs[0].op is None:
        return None
    out = outs[0]
    slots = [next((k for k, t in enumerate(tensors) if t is inp), None) for inp in out.inputs]
    if None in slots:
        return None
    grads: List[Any] = [None] * len(tensors)
    for k, part in zip(slots, out.op.gradient_as_tuple(weights[0], out)):
        grads[k] = part if grads[k] is None else grads[k] + part
    return grads


def input_gradients(outs: Sequence[Any], tensors: Sequence[Any], weights: Sequence[np.ndarray],
                    device: Any) -> List[Any]:
    """d sum_i <outs[i], weights[i]> / d tensors (Tensors, None where no gradient reaches).

    When ``outs`` is one op applied to ``tensors``, its ``gradient`` is called directly (as the
    course's own ``gradient_check`` does), so an op's graded test needs neither ``backward()``
    (hw1.autograd) nor the ops of a loss; otherwise the loss is built and ``backward()`` run.
    """
    ws = [ndl.Tensor(w, device=device, dtype="float64") for w in weights]
    direct = _direct_partials(outs, tensors, ws)
    if direct is not None:
        return direct
    loss = None
    for o, w in zip(outs, ws):
        term = (o * w).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    return [t.grad for t in tensors]


def check_op_gradient(fn: Callable[..., Any], np_fn: Callable[..., Any],
                      arrays: Sequence[np.ndarray], device: Any,
                      rng: Optional[np.random.Generator] = None, eps: float = 1e-6,
                      rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Assert needle's gradient of ``fn`` equals central differences of the NumPy ``np_fn``.

    The loss is a random weighting of every output, so each output element's gradient matters.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    ref_outs = [np.asarray(o) for o in as_list(np_fn(*arrays))]
    weights = [rng.standard_normal(o.shape) for o in ref_outs]
    tensors = [ndl.Tensor(a, device=device, dtype="float64") for a in arrays]
    grads = input_gradients(as_list(fn(*tensors)), tensors, weights, device)
    expected = numerical_grad(lambda *xs: weighted_sum(as_list(np_fn(*xs)), weights), arrays, eps)
    for i, (t, grad, g) in enumerate(zip(tensors, grads, expected)):
        assert grad is not None, f"input {i} got no gradient"
        assert grad.shape == t.shape, f"input {i}: grad shape {grad.shape} != {t.shape}"
        assert grad.dtype == "float64", f"input {i}: grad dtype {grad.dtype}"
        np.testing.assert_allclose(grad.numpy(), g, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


@contextlib.contextmanager
def wall_clock_bound(seconds: float, message: str) -> Iterator[None]:
    """Raise TimeoutError(message) past ``seconds`` (once control is back in Python), and kill
    the whole run 60 s later if it never comes back (a kernel that never returns)."""
    def timed_out(signum: int, frame: object) -> None:
        raise TimeoutError(message)
    old = signal.signal(signal.SIGALRM, timed_out)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 60, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def dropout_uniform_reference(seed: int, offset: int, n: int) -> np.ndarray:
    """The uniforms dropout.cu draws, computed with NumPy (SplitMix64), for exact tests."""
    def mix(z: np.ndarray) -> np.ndarray:
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    with np.errstate(over="ignore"):
        i = np.uint64(offset % 2 ** 64) + np.arange(n, dtype=np.uint64)
        h = mix(np.uint64(seed % 2 ** 64) ^ mix(i))
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def adam_reference(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int,
                   lr: float, b1: float, b2: float, eps: float, wd: float, decoupled: bool
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, m, v) after Adam's step t (Kingma & Ba, Algorithm 1, L2 decay in the gradient), or
    AdamW's (Loshchilov & Hutter: the decay applied to p first), in NumPy."""
    if decoupled:
        p = p - lr * wd * p
    else:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), m, v
