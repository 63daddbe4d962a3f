"""Optimizers: SGD with momentum, Adam and AdamW, following the course's update rules. Steps
build no graph; tied weights update once; parameters without ``.grad`` are skipped."""
import functools
from typing import Any, Callable, Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from .. import numbers
from ..autograd import Tensor
from ..backend_ndarray import NDArray, capture_hooks
from ..backend_ndarray import fused_ops as fused
from ..backend_ndarray.dtypes import FLOATS
from ..backend_ndarray.fused_ops import has_primitive
from ..process_state import switches
from .hyper import Hyper


def unique_by_identity(params: Iterable[Tensor]) -> List[Tensor]:
    """``params`` in order, each object once (a tied weight is one parameter)."""
    return list({id(p): p for p in params}.values())


def _profiled_step(step: Callable[[Any], None]) -> Callable[[Any], None]:
    """``step``, shown as an "optimizer" range while ``needle.profiler`` records."""
    @functools.wraps(step)
    def wrapped(self: Any) -> None:
        if switches.profiler is None:
            return step(self)
        name = f"Optimizer.step#{type(self).__name__}.step"  # torch.profiler's name
        with switches.profiler.range(name, "optimizer"):
            return step(self)
    return wrapped


class Optimizer:
    """Base class: holds the (deduplicated) parameters and per-parameter state. Each name in
    ``hyperparameters`` is a ``Hyper`` (checked when set, by ``__init__`` or a schedule)."""

    hyperparameters: tuple = ("lr",)
    lr = Hyper(lo=0)  # 0 freezes (a schedule's last step); negative climbs the loss

    def __init__(self, params: Iterable[Tensor]) -> None:
        if isinstance(params, Tensor):  # iterating it would give new row tensors, never updated
            raise TypeError(f"{type(self).__name__}: params must be an iterable of Tensors, "
                            "got one Tensor (pass [tensor] or model.parameters())")
        if not hasattr(params, "__iter__"):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of Tensors, "
                            f"got {type(params).__name__}")
        params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer params must be Tensors, got {type(p).__name__}")
        self.params = unique_by_identity(params)
        if not self.params:  # as PyTorch: a step that updates nothing is a mistake upstream
            raise ValueError(f"{type(self).__name__}: got an empty parameter list (nothing to "
                             "optimize: a model without parameters, or a spent generator?)")
        self.state: Dict[int, Dict[str, Any]] = {}
        # (device, dtype) -> what a multi-tensor step keeps on that device (not state_dict's)
        self._multi_tensor_states: Dict[Tuple[Any, str], fused.MultiTensorState] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:  # needle.profiler shows each step as a range
            cls.step = _profiled_step(cls.__dict__["step"])

    def step(self) -> None:
        """Update every parameter that has a gradient."""
        raise NotImplementedError()

    def reset_grad(self) -> None:
        """Drop all parameter gradients (``p.grad = None``)."""
        for p in self.params:
            p.grad = None

    zero_grad = reset_grad

    def _grads(self):
        """(index, param, data, grad in the param's dtype) for each param with a grad."""
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            w = p.realize_cached_data()
            dtype = w.dtype
            if dtype not in FLOATS:  # Adam's step on int64 rounds to 0: no change
                raise TypeError(f"param {i}: a {dtype} parameter cannot be stepped "
                                f"(optimizers update float parameters)")
            g = p.grad.realize_cached_data()
            if g.dtype != dtype:
                g = g.astype(dtype)
            if g.shape != w.shape:
                raise ValueError(f"param {i}: grad shape {g.shape} != param shape {w.shape}")
            gdev, wdev = getattr(g, "device", None), getattr(w, "device", None)
            if gdev is not wdev and gdev != wdev:  # Adam stepped on (devices are singletons)
                raise ValueError(f"param {i}: grad on {gdev}, param on {wdev}")
            yield i, p, w, g

    def _grads_unless(self, name: str, groups: Dict[Tuple[Any, str], List[Any]]
                      ) -> Iterator[Tuple[int, Tensor, NDArray, NDArray]]:
        """``_grads()``, but the items on a device offering primitive ``name`` (a multi-tensor
        step) go to ``groups`` by (device, dtype) instead of being yielded. Where the first
        parameter's device lacks it (the CPU) this is ``_grads()``: nothing asked per param."""
        first = self.params[0].realize_cached_data() if self.params else None
        if not has_primitive(getattr(first, "device", None), name):  # NumPy's: none, or a str
            return self._grads()
        return self._grads_split(name, groups)

    def _grads_split(self, name: str, groups: Dict[Tuple[Any, str], List[Any]]
                     ) -> Iterator[Tuple[int, Tensor, NDArray, NDArray]]:
        last, multi = None, False
        for item in self._grads():
            dev = item[2].device
            if dev is not last:  # asked once per device, not per parameter
                last, multi = dev, has_primitive(dev, name)
            if multi:
                groups.setdefault((dev, item[2].dtype), []).append(item)
            else:
                yield item

    def _multi_tensor(self, key: Tuple[Any, str]) -> fused.MultiTensorState:
        """The device-side state of the multi-tensor steps of group ``key`` (device, dtype);
        a parameter's slot there is its index in ``self.params``."""
        mt = self._multi_tensor_states.get(key)
        if mt is None:
            mt = self._multi_tensor_states[key] = fused.MultiTensorState(key[0], len(self.params))
        return mt

    def _multi_tensor_lists(self, items: Sequence[Tuple[int, Tensor, NDArray, NDArray]],
                            names: Sequence[str], counted: bool
                            ) -> Tuple[List[NDArray], List[NDArray], List[Dict[str, Any]]]:
        """(params, grads, states) of ``_grads()`` items for a multi-tensor kernel: each
        parameter's data made compact once (then updated in place at a fixed address), its
        gradient compact, and its state buffers ``names`` compact in the accumulator dtype
        (zeros when new; with ``counted``, a new state's "step" is 0)."""
        ps, gs, states = [], [], []
        for i, p, w, g in items:
            if not w.is_compact():
                w = p.cached_data = w.compact()
            acc = "float64" if w.dtype == "float64" else "float32"
            s = self.state.get(i)
            if s is None:
                s = {}
                if names or counted:
                    self.state[i] = s
                if counted:
                    s["step"] = 0
            for name in names:
                buf = s.get(name)
                if buf is None:
                    buf = NDArray.make(w.shape, device=w.device, dtype=acc)
                    buf.fill(0)
                elif buf.dtype != acc or not buf.is_compact():
                    buf = buf.astype(acc).compact()
                s[name] = buf
            ps.append(w)
            gs.append(g.compact())
            states.append(s)
        if capture_hooks.CURRENT[0] is not None:
            self._captured(states if counted else [])
        return ps, gs, states

    def _captured(self, states: List[Dict[str, Any]]) -> None:
        """This step is being captured into a CUDA graph (``backend_cuda/graphs.py``): each
        replay counts the step on the host as this call does (the capture itself runs nothing:
        its count is taken back), and raises if a hyperparameter (baked into the device's copy
        at capture) was changed since."""
        for name in self.hyperparameters:
            capture_hooks.watch(f"{type(self).__name__}.{name}",
                                functools.partial(getattr, self, name))
        if states:
            def count(by: int) -> None:
                for s in states:
                    s["step"] += by
            capture_hooks.counted_step(count)

    def state_dict(self) -> Dict[str, Any]:
        """Hyperparameters and per-parameter state (NumPy copies), keyed by parameter index."""
        state = {str(i): {k: (v.numpy() if isinstance(v, NDArray) else v) for k, v in s.items()}
                 for i, s in self.state.items()}
        hyper = {k: getattr(self, k) for k in self.hyperparameters}
        return {"hyper": hyper, "state": state}

    def _state_shape(self, name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The shape of state ``name`` of a parameter of ``shape`` (its own, unless factored)."""
        return shape

    def _loaded_value(self, i: int, name: str, v: Any) -> Any:
        """State ``name`` of param ``i`` as loaded: an array checked and copied, a count whole."""
        if isinstance(v, (np.ndarray, NDArray)):
            return self._loaded_array(i, name, v)
        if isinstance(v, np.generic):
            v = v.item()
        if name == "step":  # Adafactor's per-parameter count: 1.5 ran as a step
            return numbers.count(v, f"optimizer state 'step' of param {i}", lo=0)
        return v

    def _loaded_array(self, i: int, name: str, v: Any) -> Any:
        """State array ``name`` of param ``i`` as loaded: checked, copied to the param's device."""
        p = self.params[i]
        want = self._state_shape(name, tuple(p.shape))
        if tuple(v.shape) != want:
            raise ValueError(f"optimizer state {name!r} of param {i} has shape "
                             f"{tuple(v.shape)}, expected {want} (param {tuple(p.shape)})")
        if str(v.dtype) not in FLOATS:  # an int m would be stepped as 0
            raise ValueError(f"optimizer state {name!r} of param {i} has dtype {v.dtype}; "
                             f"expected a float dtype")
        # a copy through Tensor: an NDArray, or NumPy's under NEEDLE_BACKEND=np
        return Tensor(v, device=p.device, dtype=p.dtype, requires_grad=False).realize_cached_data()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore hyperparameters and state saved by ``state_dict`` (same parameter order)."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"optimizer state_dict must be a dict, got "
                            f"{type(state_dict).__name__}")
        if set(state_dict) != {"hyper", "state"}:
            raise ValueError(f"optimizer state_dict needs keys 'hyper' and 'state', got "
                             f"{sorted(state_dict)}")
        new: Dict[int, Dict[str, Any]] = {}
        for key, s in state_dict["state"].items():
            i = numbers.count(key, "optimizer state key (a parameter index)", lo=0)
            if not 0 <= i < len(self.params):
                raise ValueError(f"optimizer state for param {i}, but only "
                                 f"{len(self.params)} params")
            new[i] = {name: self._loaded_value(i, name, v) for name, v in s.items()}
        for k, v in state_dict["hyper"].items():
            if k not in self.hyperparameters:
                raise ValueError(f"unknown optimizer hyperparameter {k!r} for "
                                 f"{type(self).__name__}")
            setattr(self, k, v.item() if isinstance(v, np.generic) else v)
        self.state = new


class SGD(Optimizer):
    """SGD with (course-style) momentum and L2 weight decay.

    As in the course (hw2): g = grad + weight_decay * w;  u = momentum * u + (1 - momentum) * g
    with u starting at 0;  w = w - lr * u. This is torch's SGD with ``dampening=momentum``
    except on the first step (torch starts u at g, the course at (1 - momentum) g).
    """

    hyperparameters = ("lr", "momentum", "weight_decay")
    momentum = Hyper(lo=0, hi=1, hi_open=True)  # at 1, u = (1 - momentum) g stays 0
    weight_decay = Hyper(lo=0)

    def __init__(self, params: Iterable[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay

    @property
    def u(self) -> Dict[int, NDArray]:
        """Momentum buffers by parameter index (course name)."""
        return {i: s["u"] for i, s in self.state.items() if "u" in s}

    def step(self) -> None:
        """Exercise hw2.optim.sgd: one step of the rule above for each ``(i, p, w, g)`` of
        ``self._grads()`` (index, parameter, its data and gradient as NDArrays; parameters
        without a gradient are skipped there). Keep u in ``self.state[i]["u"]`` (created on the
        first step, only when momentum is nonzero); rebind ``p.cached_data`` to the new weight
        (no graph is recorded)."""
        ### BEGIN YOUR SOLUTION (hw2.optim.sgd)
        groups: Dict[Tuple[Any, str], List[Any]] = {}  # one kernel for each, below
        for i, p, w, g in self._grads_unless("multi_tensor_sgd", groups):
            if self.weight_decay:
                g = g + w * self.weight_decay
            if self.momentum:
                s = self.state.setdefault(i, {})
                if "u" not in s:
                    s["u"] = g * (1 - self.momentum)
                else:  # u = momentum * u + (1 - momentum) * g, in place
                    s["u"] *= self.momentum
                    s["u"] += g * (1 - self.momentum)
                g = s["u"]
            p.cached_data = w - g * self.lr
        for key, items in groups.items():  # parameters updated in place
            ps, gs, ss = self._multi_tensor_lists(items, ("u",) if self.momentum else (), False)
            fused.multi_tensor_sgd(ps, gs, [s.get("u") for s in ss], self._multi_tensor(key),
                                   self.lr, self.momentum, self.weight_decay)
        ### END YOUR SOLUTION


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay (Kingma & Ba, arXiv:1412.6980, Alg. 1).

    g = grad + weight_decay * w; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w = w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). The step count t is kept
    per parameter (as torch); it equals the course's global t when every parameter has a
    gradient at every step.
    """

    hyperparameters = ("lr", "beta1", "beta2", "eps", "weight_decay", "t")
    beta1 = Hyper(lo=0, hi=1, hi_open=True)  # at 1, the bias corrections divide by 0
    beta2 = Hyper(lo=0, hi=1, hi_open=True)
    eps = Hyper(lo=0)
    weight_decay = Hyper(lo=0)
    t = Hyper(lo=0, count=True)
    decoupled = False  # weight decay folded into the gradient (L2); AdamW decouples it

    def __init__(self, params: Iterable[Tensor], lr: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr = lr
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        self.t = 0

    @property
    def m(self) -> Dict[int, NDArray]:
        """First-moment estimates by parameter index (course name)."""
        return {i: s["m"] for i, s in self.state.items()}

    @property
    def v(self) -> Dict[int, NDArray]:
        """Second-moment estimates by parameter index (course name)."""
        return {i: s["v"] for i, s in self.state.items()}

    def _decay(self, w: NDArray, g: NDArray) -> "tuple[NDArray, NDArray]":
        """L2 decay folded into the gradient (Adam); AdamW overrides."""
        if self.weight_decay:
            g = g + w * self.weight_decay
        return w, g

    def step(self) -> None:
        """Exercise hw2.optim.adam: one step of the rule above for each ``(i, p, w, g)`` of
        ``self._grads()``. ``w, g = self._decay(w, g)`` applies the weight decay (AdamW
        overrides it). State per parameter in ``self.state[i]``: ``{"step", "m", "v"}``, m and
        v starting at zeros like g, "step" counting this parameter's steps (the t of the bias
        corrections). Rebind ``p.cached_data`` to the new weight."""
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        ### BEGIN YOUR SOLUTION (hw2.optim.adam)
        groups: Dict[Tuple[Any, str], List[Any]] = {}  # one kernel for each, below
        for i, p, w, g in self._grads_unless("multi_tensor_adam", groups):
            w, g = self._decay(w, g)
            s = self.state.get(i)
            if s is None:
                s = self.state[i] = {"step": 0, "m": g * 0, "v": g * 0}
            s["step"] += 1
            s["m"] = s["m"] * b1 + g * (1 - b1)
            s["v"] = s["v"] * b2 + g * g * (1 - b2)
            m_hat = s["m"] / (1 - b1 ** s["step"])
            v_hat = s["v"] / (1 - b2 ** s["step"])
            p.cached_data = w - m_hat * self.lr / (v_hat ** 0.5 + self.eps)
        for key, items in groups.items():  # parameters updated in place (PyTorch's fused Adam)
            ps, gs, ss = self._multi_tensor_lists(items, ("m", "v"), True)
            for s in ss:
                s["step"] += 1
            fused.multi_tensor_adam(ps, gs, [s["m"] for s in ss], [s["v"] for s in ss],
                                    [it[0] for it in items], [s["step"] for s in ss],
                                    self._multi_tensor(key), self.lr, b1, b2, self.eps,
                                    self.weight_decay, decoupled=self.decoupled)
        ### END YOUR SOLUTION


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, arXiv:1711.05101, Alg. 2).

    w = w - lr * weight_decay * w, then the Adam step on the raw gradient (as torch.optim.AdamW).
    """

    decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        super().__init__(params, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay)

    def _decay(self, w: NDArray, g: NDArray) -> "tuple[NDArray, NDArray]":
        if self.weight_decay:
            w = w * (1 - self.lr * self.weight_decay)
        return w, g
