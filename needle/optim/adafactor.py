"""Adafactor: Adam-like steps with factored second moments (O(n + m) state per n x m matrix).

Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost"
(arXiv:1804.04235), Algorithms 4-5 with the paper's defaults: for a matrix gradient G,

    R_t = b2_t R_{t-1} + (1 - b2_t) rowsum(G^2 + eps1)       (n x 1)
    C_t = b2_t C_{t-1} + (1 - b2_t) colsum(G^2 + eps1)       (1 x m)
    V_t = R_t C_t / sum(R_t)                                 (rank-1 estimate of E[G^2])
    U_t = G / sqrt(V_t);  U_t /= max(1, RMS(U_t) / d)        (update clipping, d = 1)
    a_t = max(eps2, RMS(X_{t-1})) * rho_t,  rho_t = min(1e-2, 1 / sqrt(t))   (relative step)
    X_t = X_{t-1} - a_t U_t,   b2_t = 1 - t^(-0.8)

Vectors keep an unfactored V. Tensors with more than two axes are factored over the last two.
Without momentum (``beta1=None``, the paper's choice) the state of an n x m weight is n + m
numbers instead of Adam's 2 n m.
"""
import math
from typing import Iterable, Optional, Tuple

from ..autograd import Tensor
from ..backend_ndarray import NDArray
from .hyper import Hyper
from .optimizer import Optimizer


def _rms(x: NDArray) -> float:
    return math.sqrt(float((x * x).sum().numpy()) / max(x.size, 1))


class Adafactor(Optimizer):
    """Adafactor with factored second moments, update clipping and relative step sizes."""

    hyperparameters = ("lr", "beta1", "eps1", "eps2", "clip_threshold", "decay_rate",
                       "weight_decay", "relative_step", "scale_parameter")
    lr = Hyper(lo=0, optional=True)  # None: relative steps
    beta1 = Hyper(lo=0, hi=1, hi_open=True, optional=True)  # None: no momentum
    eps1 = Hyper(lo=0)
    eps2 = Hyper(lo=0)
    clip_threshold = Hyper(lo=0, lo_open=True)
    decay_rate = Hyper(hi=0)  # b2_t = 1 - t^decay_rate must stay in [0, 1)
    weight_decay = Hyper(lo=0)
    relative_step = Hyper(flag=True)
    scale_parameter = Hyper(flag=True)

    def __init__(self, params: Iterable[Tensor], lr: Optional[float] = None,
                 beta1: Optional[float] = None, eps1: float = 1e-30, eps2: float = 1e-3,
                 clip_threshold: float = 1.0, decay_rate: float = -0.8,
                 weight_decay: float = 0.0, relative_step: Optional[bool] = None,
                 scale_parameter: bool = True) -> None:
        super().__init__(params)
        self.lr = lr
        if lr is not None and lr == 0:
            raise ValueError(f"Adafactor: lr must be positive, got {lr}")
        self.beta1 = beta1
        self.eps1, self.eps2 = eps1, eps2
        self.clip_threshold = clip_threshold
        self.decay_rate = decay_rate
        self.weight_decay = weight_decay
        self.relative_step = lr is None if relative_step is None else relative_step
        self.scale_parameter = scale_parameter

    def _state_shape(self, name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """Factored second moments: 'row' (..., n, 1) and 'col' (..., 1, m)."""
        if name == "row":
            return shape[:-1] + (1,)
        if name == "col":
            return shape[:-2] + (1,) + shape[-1:]
        return shape

    def _step_size(self, step: int, w: NDArray) -> float:
        if self.relative_step:
            rho = min(1e-2, 1.0 / math.sqrt(step))
        elif self.lr is None:
            raise ValueError("Adafactor: relative_step=False needs an lr (got lr=None)")
        else:
            rho = self.lr
        if self.scale_parameter:
            return max(self.eps2, _rms(w)) * rho
        return rho

    def step(self) -> None:
        for i, p, w, g in self._grads():
            s = self.state.get(i)
            factored = g.ndim >= 2
            if s is None:
                s = self.state[i] = {"step": 0}
                if factored:
                    s["row"] = g.sum(axis=g.ndim - 1, keepdims=True) * 0      # (..., n, 1)
                    s["col"] = g.sum(axis=g.ndim - 2, keepdims=True) * 0      # (..., 1, m)
                else:
                    s["v"] = g * 0
                if self.beta1 is not None:
                    s["m"] = g * 0
            s["step"] += 1
            t = s["step"]
            b2 = 1.0 - t ** self.decay_rate
            g2 = g * g + self.eps1
            if factored:
                s["row"] = s["row"] * b2 + g2.sum(axis=g.ndim - 1, keepdims=True) * (1 - b2)
                s["col"] = s["col"] * b2 + g2.sum(axis=g.ndim - 2, keepdims=True) * (1 - b2)
                row_total = s["row"].sum(axis=g.ndim - 2, keepdims=True)      # (..., 1, 1)
                r = (s["row"] / row_total.broadcast_to(s["row"].shape)).broadcast_to(g.shape)
                v = r * s["col"].broadcast_to(g.shape)
            else:
                s["v"] = s["v"] * b2 + g2 * (1 - b2)
                v = s["v"]
            u = g / v.sqrt()
            u = u / max(1.0, _rms(u) / self.clip_threshold)
            if self.beta1 is not None:
                s["m"] = s["m"] * self.beta1 + u * (1 - self.beta1)
                u = s["m"]
            alpha = self._step_size(t, w)
            if self.weight_decay:
                w = w * (1 - self.weight_decay * alpha)
            p.cached_data = w - u * alpha
