"""The basic layers of the course (hw2): Linear, activations, normalization, dropout, loss.

Layers never create arrays without the device and dtype of their input or parameters, so the
same model code runs on ``ndl.cpu()`` and ``ndl.cuda()``.
"""
import math
from typing import Any, Optional

import numpy as np

from .. import init, numbers, ops
from ..autograd import Tensor
from ..backend_ndarray import BackendDevice
from ..backend_ndarray.dtypes import is_floating, to_numpy_dtype
from ..backend_ndarray.fused_ops import has_primitive
from .nn_module import LoadResult, Module, Parameter  # noqa: F401  (course: nn_basic.Parameter)


def in_weight_dtype(x: Tensor, weight: Tensor) -> Tensor:
    """``x`` cast down to ``weight``'s dtype when it is a wider float.

    A float32 model fed float64 NumPy data computes in float32, its own dtype, not silently in
    float64. PyTorch raises here; the course's hw2/hw4 tests feed float64 data to float32 layers
    and expect a result (their needle cast everything to float32). A narrower input (bfloat16
    activations under autocast) is left alone: the op's own rule applies.
    """
    a, w = to_numpy_dtype(x.dtype), to_numpy_dtype(weight.dtype)
    wider = is_floating(a) and is_floating(w) and a.itemsize > w.itemsize
    return ops.cast(x, weight.dtype) if wider else x

__all__ = ["Identity", "Linear", "Flatten", "ReLU", "Tanh", "Sigmoid", "GELU", "Sequential",
           "Residual", "SoftmaxLoss", "BatchNorm1d", "BatchNorm2d", "LayerNorm1d", "Dropout"]


class Identity(Module):
    """y = x."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def _check_flag(layer: str, name: str, value: Any) -> None:
    """A ``TypeError`` unless ``value`` is a bool ('no' would read as True)."""
    if value is not True and value is not False and not isinstance(value, np.bool_):
        raise TypeError(f"{layer}: {name} must be True or False, got {value!r}")


class Linear(Module):
    """y = x @ W + b, with W of shape (in_features, out_features) (note: not transposed)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        """Exercise hw2.nn.linear. Sets ``self.weight`` and ``self.bias`` (Parameters).

        The graded tests compare with the course's numbers after ``np.random.seed``, so the
        draws must happen in this order, from ``init.kaiming_uniform`` (NumPy's global RNG):
        1. weight: ``kaiming_uniform(in_features, out_features)``, shape (in, out);
        2. only if ``bias``: ``kaiming_uniform(out_features, 1)`` (fan_in = out_features, as
           the course), shape (out, 1), then reshaped to a row of shape (1, out_features).
        Both on ``device`` with ``dtype``; ``self.bias`` is None when ``bias`` is False.
        """
        super().__init__()
        self.in_features = numbers.count_arg(in_features, "Linear: in_features", lo=1)
        self.out_features = numbers.count_arg(out_features, "Linear: out_features", lo=1)
        _check_flag("Linear", "bias", bias)
        ### BEGIN YOUR SOLUTION (hw2.nn.linear)
        self.weight = Parameter(init.kaiming_uniform(in_features, out_features,
                                                     device=device, dtype=dtype))
        self.bias = None
        if bias:
            # as the course: drawn as (out, 1) with fan_in = out_features, then made a row
            b = init.kaiming_uniform(out_features, 1, device=device, dtype=dtype)
            self.bias = Parameter(b.reshape((1, out_features)))
        ### END YOUR SOLUTION

    def forward(self, X: Tensor) -> Tensor:
        """X (..., in_features) @ weight, plus the (1, out) bias broadcast to the result's shape
        (explicitly, with broadcast_to, as the course's ops do not broadcast); (..., out)."""
        if not X.shape or X.shape[-1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}) got input of "
                             f"shape {X.shape}")
        X = in_weight_dtype(X, self.weight)
        ### BEGIN YOUR SOLUTION (hw2.nn.linear)
        out = X @ self.weight
        if self.bias is not None:
            out = out + self.bias.broadcast_to(out.shape)
        return out
        ### END YOUR SOLUTION

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Flatten(Module):
    """(B, d1, d2, ...) -> (B, d1 * d2 * ...)."""

    def forward(self, X: Tensor) -> Tensor:
        if not X.shape:
            raise ValueError("Flatten needs a batch axis first, got a 0-d tensor")
        return X.reshape((X.shape[0], -1))


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.relu(x)


class Tanh(Module):
    """tanh(x)."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.tanh(x)


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.sigmoid(x)


class GELU(Module):
    """GELU, tanh approximation (Hendrycks & Gimpel, arXiv:1606.08415, eq. after (2)).

    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -- torch's ``approximate="tanh"``.
    """

    def forward(self, x: Tensor) -> Tensor:
        inner = (x + (x ** 3) * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * (ops.tanh(inner) + 1.0) * 0.5


class Sequential(Module):
    """Apply modules in order: as in the course, the list ``self.modules``
    (``model.modules[1].modules[0]``), which ``seq[i]``, ``len(seq)`` and ``iter(seq)`` read too
    (PyTorch's ``Module.modules()`` is ``named_modules()``)."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not callable(m):
                raise TypeError(f"Sequential: item {i} is {type(m).__name__}, not a Module")
        self.modules = list(modules)

    def forward(self, x: Any) -> Any:
        """Exercise hw2.nn.sequential: ``x`` through each module in order, each output the next
        module's input."""
        ### BEGIN YOUR SOLUTION (hw2.nn.sequential)
        for module in self.modules:
            x = module(x)
        return x
        ### END YOUR SOLUTION

    def __getitem__(self, i: int) -> Module:
        return self.modules[i]

    def __len__(self) -> int:
        return len(self.modules)

    def __iter__(self):
        return iter(self.modules)


class Residual(Module):
    """fn(x) + x."""

    def __init__(self, fn: Module) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"Residual: fn is {type(fn).__name__}, not a Module")
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x) + x


class SoftmaxLoss(Module):
    """Mean cross-entropy of logits (B, C) and integer labels y (B,): logsumexp(z) - z_y."""

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        """Exercise hw2.nn.softmax_loss: the mean over the batch of logsumexp(z_i) - z_i[y_i],
        a scalar Tensor; z_i[y_i] picked with ``init.one_hot(C, y)`` (in the logits' device and
        dtype) and ``ops.logsumexp`` over axis 1."""
        if logits.ndim != 2 or tuple(y.shape) != (logits.shape[0],):
            raise ValueError(f"SoftmaxLoss expects logits (B, C) and labels (B,), got "
                             f"{logits.shape} and {tuple(y.shape)}")
        ### BEGIN YOUR SOLUTION (hw2.nn.softmax_loss)
        n, k = logits.shape
        y_one_hot = init.one_hot(k, y, device=logits.device, dtype=logits.dtype)
        z_y = (logits * y_one_hot).sum((1,))
        return (ops.logsumexp(logits, (1,)) - z_y).sum() / n
        ### END YOUR SOLUTION


class BatchNorm1d(Module):
    """Batch normalization over the batch axis of (B, dim) inputs (Ioffe & Szegedy, 2015).

    As in the course, the *biased* batch variance is used both to normalize and to update
    ``running_var`` (torch uses the unbiased one for the running estimate):
    ``running = (1 - momentum) * running + momentum * batch_stat``.
    """

    running_mean: Tensor  # buffers (register_buffer)
    running_var: Tensor

    # the device's batch-norm kernels (ops.BatchNorm) for BatchNorm2d in training, where
    # offered: in the reference only; the student release keeps False, so forward is the
    # student's on every device
    use_kernel = False
    ### BEGIN YOUR SOLUTION (hw2.nn.batchnorm1d)
    use_kernel = True
    ### END YOUR SOLUTION

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1,
                 device: Optional[BackendDevice] = None, dtype: str = "float32") -> None:
        super().__init__()
        name = type(self).__name__
        self.dim = numbers.count_arg(dim, f"{name}: dim", lo=1)
        self.eps = numbers.real_arg(eps, f"{name}: eps", lo=0)  # negative: sqrt of a negative
        self.momentum = numbers.real_arg(momentum, f"{name}: momentum", lo=0, hi=1)
        self.weight = Parameter(init.ones(dim, device=device, dtype=dtype))
        self.bias = Parameter(init.zeros(dim, device=device, dtype=dtype))
        self.register_buffer("running_mean", init.zeros(dim, device=device, dtype=dtype))
        self.register_buffer("running_var", init.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        """Exercise hw2.nn.batchnorm1d. Training: normalize with the batch mean and biased
        variance over axis 0, ``(x - mean) / sqrt(var + eps) * weight + bias``, and update
        ``running_mean``/``running_var`` (NDArray data, no graph) by
        ``(1 - momentum) * running + momentum * batch``. Eval (``self.training`` False):
        normalize with the running statistics instead. weight, bias: (dim,), broadcast."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"{type(self).__name__}({self.dim}) got input of shape {x.shape}")
        ### BEGIN YOUR SOLUTION (hw2.nn.batchnorm1d)
        n = x.shape[0]
        if self.training:
            mean = x.sum((0,)) / n                                    # (dim,)
            centered = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
            var = (centered ** 2).sum((0,)) / n
            m, dt = self.momentum, self.running_mean.dtype  # the buffers keep their dtype
            self.running_mean = self.running_mean * (1 - m) + mean.detach().astype(dt) * m
            self.running_var = self.running_var * (1 - m) + var.detach().astype(dt) * m
        else:
            mean, var = self.running_mean, self.running_var
            centered = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
        std = ((var + self.eps) ** 0.5).reshape((1, self.dim)).broadcast_to(x.shape)
        w = self.weight.reshape((1, self.dim)).broadcast_to(x.shape)
        b = self.bias.reshape((1, self.dim)).broadcast_to(x.shape)
        return w * centered / std + b
        ### END YOUR SOLUTION

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm2d(BatchNorm1d):
    """Batch normalization of NCHW images per channel (statistics over N, H, W)."""

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.dim:
            raise ValueError(f"BatchNorm2d({self.dim}) expects NCHW input, got {x.shape}")
        if self.training and self.use_kernel and has_primitive(x.device, "batch_norm_fwd"):
            return self._kernel_forward(x)
        n, c, h, w = x.shape
        flat = x.transpose((1, 2)).transpose((2, 3)).reshape((n * h * w, c))  # (NHW, C)
        y = super().forward(flat).reshape((n, h, w, c))
        return y.transpose((2, 3)).transpose((1, 2))

    def _kernel_forward(self, x: Tensor) -> Tensor:
        """The training forward on the device's kernels; x is read in its layout (no copy)."""
        op = ops.BatchNorm(self.running_mean.realize_cached_data(),
                           self.running_var.realize_cached_data(), self.momentum, self.eps)
        y = op(x, self.weight, self.bias)
        y.realize_cached_data()
        mean, var = op.new_running
        dt = self.running_mean.dtype
        self.running_mean = Tensor.make_const(mean.astype(dt))
        self.running_var = Tensor.make_const(var.astype(dt))
        return y


class LayerNorm1d(Module):
    """Normalize over the last axis, then scale and shift (Ba et al., arXiv:1607.06450).

    By default the layer is composed from elementwise ops (the course's hw2 exercise, and
    differentiable twice). ``fused=True`` runs it as the single ``ops.layer_norm`` op instead
    (one fused kernel each way on CUDA, about 3x faster on the CPU; no double backward): the
    Transformer layers use that.
    """

    def __init__(self, dim: int, eps: float = 1e-5, device: Optional[BackendDevice] = None,
                 dtype: str = "float32", fused: bool = False) -> None:
        super().__init__()
        self.dim = numbers.count_arg(dim, "LayerNorm1d: dim", lo=1)
        self.eps = numbers.real_arg(eps, "LayerNorm1d: eps", lo=0)
        self.fused = fused
        self.weight = Parameter(init.ones(dim, device=device, dtype=dtype))
        self.bias = Parameter(init.zeros(dim, device=device, dtype=dtype))

    # fused=True on a device without the layer-norm kernels: the composed fused op
    # (fused.layer_norm_naive, tested against this layer) in the reference; the student
    # release keeps False, so there it runs the student's forward below.
    composed_fused = False
    ### BEGIN YOUR SOLUTION (hw2.nn.layernorm1d)
    composed_fused = True
    ### END YOUR SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, for x of shape
        (..., dim); mean and the biased variance (divide by dim) over that axis; weight and
        bias of shape (dim,) broadcast over the leading axes. Composed from Tensor ops
        (summation, reshape, broadcast_to, ...), so it is differentiable twice."""
        if not x.shape or x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm1d({self.dim}) got input of shape {x.shape}")
        if self.fused and (self.composed_fused or has_primitive(x.device, "layer_norm_fwd")):
            return ops.layer_norm(x, self.weight, self.bias, self.eps)
        ### BEGIN YOUR SOLUTION (hw2.nn.layernorm1d)
        keep = tuple(x.shape[:-1]) + (1,)
        mean = (x.sum((x.ndim - 1,)) / self.dim).reshape(keep).broadcast_to(x.shape)
        centered = x - mean
        var = ((centered ** 2).sum((x.ndim - 1,)) / self.dim).reshape(keep)
        std = ((var + self.eps) ** 0.5).broadcast_to(x.shape)
        ones = (1,) * (x.ndim - 1) + (self.dim,)
        w = self.weight.reshape(ones).broadcast_to(x.shape)
        b = self.bias.reshape(ones).broadcast_to(x.shape)
        return w * centered / std + b
        ### END YOUR SOLUTION

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """Inverted dropout: zero each entry with probability p and scale the rest by 1/(1-p).

    Identity in eval mode (Srivastava et al., JMLR 2014). On a device with the ``dropout``
    primitive the mask is drawn and applied in one kernel (``ops.dropout``).
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, str) or not 0.0 <= p < 1.0:  # (nan fails the comparison)
            raise ValueError(f"Dropout p must lie in [0, 1), got {p!r}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Exercise hw2.nn.dropout. Training: keep each entry where ``init.randb(*x.shape,
        p=1 - p)`` (one draw of NumPy's global RNG for the whole shape) is 1, scaled by
        1 / (1 - p); eval, or p == 0: x itself."""
        ### BEGIN YOUR SOLUTION (hw2.nn.dropout)
        if self.training and self.p and has_primitive(x.device, "dropout"):
            return ops.dropout(x, self.p)  # the device's one kernel (mask drawn there)
        if not self.training or self.p == 0.0:
            return x
        mask = init.randb(*x.shape, p=1 - self.p, device=x.device, dtype=x.dtype)
        return x * mask / (1 - self.p)
        ### END YOUR SOLUTION

    def extra_repr(self) -> str:
        return f"p={self.p}"
