"""Gradient checkpointing: keep segment inputs, recompute the insides in backward.

Chen, Xu, Zhang & Guestrin, "Training Deep Nets with Sublinear Memory Cost" (arXiv:1604.06174):
a chain of n layers cut into k segments keeps only the k segment inputs during forward and
recomputes one segment at a time during backward, so activation memory is O(n/k + k), i.e.
O(sqrt(n)) with k = sqrt(n), for one extra forward pass.

``checkpoint(fn, *inputs)`` is one ``Checkpoint`` op: ``compute`` runs ``fn`` under ``no_grad``;
``gradient`` replays NumPy's random state (same dropout masks), re-runs ``fn`` with grad on,
checks the output is bitwise the saved one and backpropagates through it. ``fn``'s parameters
are explicit inputs of the op, so the outer backward delivers their gradients. Same ops, same
order: on the CPU the gradients are bitwise the plain model's. First-order only, and ``fn``
returns one Tensor.
"""
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from .. import autograd
from ..autograd import Tensor, TensorOp, Value, enable_grad, find_topo_sort, no_grad
from ..optim.optimizer import unique_by_identity
from .accumulate import near_equal_bounds

__all__ = ["checkpoint", "checkpoint_sequential", "Checkpoint", "NondeterministicCheckpoint",
           "segment_bounds"]


class NondeterministicCheckpoint(ValueError):
    """The recomputed forward of a checkpointed function differs from the original."""


def _params_of(fn: Any) -> List[Tensor]:
    """Trainable parameters of ``fn`` when it is a Module (or a bound method of one)."""
    owner = getattr(fn, "__self__", fn)
    if hasattr(owner, "parameters") and callable(owner.parameters):
        return [p for p in owner.parameters() if p.requires_grad]
    return []


class Checkpoint(TensorOp):
    """out = fn(*inputs), recomputed in backward instead of keeping fn's intermediates."""

    def __init__(self, fn: Callable[..., Tensor], num_inputs: int, check: bool = True):
        self.fn = fn
        self.num_inputs = num_inputs
        self.check = check
        self.rng_state: Any = None

    def compute(self, *arrays: Any) -> Any:
        self.rng_state = np.random.get_state()
        leaves = [Tensor.make_const(a) for a in arrays[: self.num_inputs]]
        with no_grad():
            out = self.fn(*leaves)
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return a single Tensor, got "
                            f"{type(out).__name__}")
        return out.realize_cached_data()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Any, ...]:
        inputs = node.inputs[: self.num_inputs]
        params = node.inputs[self.num_inputs:]
        leaves = [Tensor.make_const(x.realize_cached_data(), requires_grad=x.requires_grad)
                  for x in inputs]
        saved_grads = [p.grad for p in params]
        rng_now = np.random.get_state()
        np.random.set_state(self.rng_state)  # replay: dropout draws the same masks
        try:
            with enable_grad():
                out = self.fn(*leaves)
        finally:
            np.random.set_state(rng_now)
        self._check_same(out, node)
        self._check_closed(out, leaves, params)
        with no_grad():
            out.backward(Tensor.make_const(out_grad.realize_cached_data()), create_graph=False)
        grads: List[Any] = []
        for t in list(leaves) + list(params):
            if t.grad is None and t.requires_grad:  # not used by fn: a zero gradient
                t.grad = Tensor.make_const(t.realize_cached_data() * 0)
            grads.append(t.grad.detach() if t.grad is not None else None)
        for p, g in zip(params, saved_grads):
            p.grad = g  # the outer backward sets the real value; leave no side effect
        return tuple(grads)

    def _check_same(self, out: Tensor, node: Tensor) -> None:
        if not self.check:
            return
        new = out.realize_cached_data()
        old = node.realize_cached_data()
        if new.shape != old.shape or new.dtype != old.dtype:
            raise NondeterministicCheckpoint(
                f"checkpoint: recomputed output has shape {new.shape} / dtype {new.dtype} but "
                f"the forward produced {old.shape} / {old.dtype}")
        a, b = new.numpy(), old.numpy()
        if not np.array_equal(a, b, equal_nan=True):
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            raise NondeterministicCheckpoint(
                f"checkpoint: fn is not deterministic: its recomputed output differs from the "
                f"forward output (max abs diff {diff:.3g}). Random draws must come from NumPy's "
                f"global RNG (which checkpoint replays); pass check=False to skip this test")

    @staticmethod
    def _check_closed(out: Tensor, leaves: Sequence[Tensor], params: Sequence[Value]) -> None:
        known = {id(t) for t in leaves} | {id(p) for p in params}
        for n in find_topo_sort([out]):
            if isinstance(n, Tensor) and n.op is None and n.requires_grad and id(n) not in known:
                raise ValueError(
                    f"checkpoint: fn uses a tensor of shape {n.shape} that requires grad but is "
                    f"neither an input nor a parameter; pass it in params=[...] (or make fn a "
                    f"Module) so that it receives its gradient")


def checkpoint(fn: Callable[..., Tensor], *inputs: Tensor,
               params: Optional[Sequence[Tensor]] = None, check: bool = True) -> Tensor:
    """fn(*inputs) without keeping fn's intermediates; they are recomputed in backward.

    ``params`` are the tensors fn uses that need gradients (default: fn's Module parameters).
    """
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"checkpoint: input {i} must be a Tensor, got {type(x).__name__}")
    params = list(_params_of(fn) if params is None else params)
    if not autograd.is_grad_enabled() or not any(
            t.requires_grad for t in list(inputs) + params):
        return fn(*inputs)  # no backward will happen: nothing to save or recompute
    unique = unique_by_identity(params)  # a tied weight is one input of the op
    return Checkpoint(fn, len(inputs), check=check)(*inputs, *unique)


def segment_bounds(n: int, segments: int) -> List[Tuple[int, int]]:
    """[start, end) of ``segments`` near-equal consecutive pieces of a chain of ``n``."""
    if n < 1:
        raise ValueError("checkpoint_sequential needs at least one module")
    if not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be a positive int, got {segments!r}")
    if segments > n:
        raise ValueError(f"segments ({segments}) is larger than the chain ({n} modules)")
    return near_equal_bounds(n, segments)


def _run_chain(modules: Sequence[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        for m in modules:
            x = m(x)
        return x
    return run


def checkpoint_sequential(modules: Any, segments: Optional[int] = None, x: Tensor = None, *,
                          boundaries: Optional[Sequence[int]] = None,
                          checkpoint_last: bool = False, check: bool = True) -> Tensor:
    """Run a chain of modules keeping only segment inputs; the last segment runs normally.

    ``segments`` defaults to round(sqrt(n)); ``boundaries`` and ``checkpoint_last`` take the
    ``.boundaries`` and ``.checkpoint_last`` of ``choose_checkpoints``' answer."""
    mods = list(modules)  # a Sequential iterates over its layers
    if x is None:
        raise TypeError("checkpoint_sequential needs an input tensor x")
    n = len(mods)
    if boundaries is not None:
        cuts = sorted(set(int(b) for b in boundaries) | {0})
        if cuts[-1] >= n or cuts[0] < 0:
            raise ValueError(f"boundaries {list(boundaries)} must lie in [0, {n})")
        bounds = list(zip(cuts, cuts[1:] + [n]))
    else:
        k = max(1, round(math.sqrt(n))) if segments is None else segments
        bounds = segment_bounds(n, k)
    ckpt = bounds if checkpoint_last else bounds[:-1]
    for start, end in ckpt:
        part = mods[start:end]
        params = [p for m in part for p in _params_of(m)]
        x = checkpoint(_run_chain(part), x, params=params, check=check)
    if checkpoint_last:
        return x
    start, end = bounds[-1]
    return _run_chain(mods[start:end])(x)
