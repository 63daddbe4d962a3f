"""Elementwise, shape and linear-algebra operators, each a TensorOp with a lowercase wrapper.

Binary ops broadcast by NumPy's rules; their gradients are summed back to each input's shape.
"""
import math
from typing import Any, Optional, Tuple

from .. import backend_ndarray as array_api
from ..autograd import NDArray, Tensor, TensorOp, no_grad
from ..backend_ndarray import to_numpy_dtype
from ..backend_ndarray.dtypes import is_floating
from .ops_reduce import summation

__all__ = [
    "EWiseAdd", "add", "AddScalar", "add_scalar", "EWiseMul", "multiply", "MulScalar",
    "mul_scalar", "EWisePow", "power", "PowerScalar", "power_scalar", "EWiseDiv", "divide",
    "DivScalar", "divide_scalar", "Negate", "negate", "Log", "log", "Exp", "exp", "ReLU", "relu",
    "Tanh", "tanh", "Sigmoid", "sigmoid", "Transpose", "transpose", "Reshape", "reshape",
    "BroadcastTo", "broadcast_to", "MatMul", "matmul", "Maximum", "maximum", "MaximumScalar",
    "maximum_scalar", "Cast", "cast", "Where", "where", "unbroadcast",
]


def unbroadcast(grad: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """Sum ``grad`` over the axes along which an input of ``shape`` was broadcast.

    Exercise hw1.ops.broadcast_to: this is ``BroadcastTo.gradient`` (every broadcasting binary
    op's gradient uses it too). NumPy's rules: ``shape`` was padded with leading 1s to
    ``grad``'s rank, then each axis of size 1 was stretched. Sum the leading axes away and the
    stretched axes with keepdims, so the result has exactly ``shape`` (a Tensor op: the gradient
    is itself differentiable). Called only when the shapes differ.
    """
    if grad.shape == shape:
        return grad
    ### BEGIN YOUR SOLUTION (hw1.ops.broadcast_to)
    lead = len(grad.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(shape) if s == 1 and grad.shape[i + lead] != 1)
    if axes:
        grad = summation(grad, axes)
    return reshape(grad, shape)
    ### END YOUR SOLUTION


class _ScalarOp(TensorOp):
    """An op on one tensor and the Python number ``self.scalar``."""

    def __init__(self, scalar: float):
        self.scalar = scalar


class EWiseAdd(TensorOp):
    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return a + b

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        a, b = node.inputs
        return unbroadcast(out_grad, a.shape), unbroadcast(out_grad, b.shape)


def add(a: Tensor, b: Tensor) -> Tensor:
    """a + b (broadcasting)."""
    return EWiseAdd()(a, b)


class AddScalar(_ScalarOp):
    def compute(self, a: NDArray) -> NDArray:
        return a + self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return out_grad


def add_scalar(a: Tensor, scalar: float) -> Tensor:
    """a + scalar."""
    return AddScalar(scalar)(a)


class EWiseMul(TensorOp):
    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return a * b

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        """Exercise hw1.ops.multiply: (out_grad * b, out_grad * a), each ``unbroadcast`` to its
        input's shape."""
        a, b = node.inputs
        ### BEGIN YOUR SOLUTION (hw1.ops.multiply)
        return unbroadcast(out_grad * b, a.shape), unbroadcast(out_grad * a, b.shape)
        ### END YOUR SOLUTION


def multiply(a: Tensor, b: Tensor) -> Tensor:
    """a * b (broadcasting)."""
    return EWiseMul()(a, b)


class MulScalar(_ScalarOp):
    def compute(self, a: NDArray) -> NDArray:
        return a * self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return out_grad * self.scalar


def mul_scalar(a: Tensor, scalar: float) -> Tensor:
    """a * scalar."""
    return MulScalar(scalar)(a)


class EWisePow(TensorOp):
    """a ** b for tensors a, b."""

    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return a ** b

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        """Exercise hw1.ops.power: (out_grad * b * a ** (b - 1), out_grad * a ** b * log(a)), each
        ``unbroadcast`` to its input's shape; Tensor ops only, so it is differentiable again."""
        ### BEGIN YOUR SOLUTION (hw1.ops.power)
        a, b = node.inputs
        # both in the result's dtype, as PyTorch computes them: with a float32 operand and a
        # float64 one, b - 1 and log(a) are not rounded to float32 first
        wide_a, wide_b = cast(a, node.dtype), cast(b, node.dtype)
        grad_a = out_grad * wide_b * wide_a ** (wide_b - 1)
        grad_b = out_grad * node * log(wide_a)
        return unbroadcast(grad_a, a.shape), unbroadcast(grad_b, b.shape)
        ### END YOUR SOLUTION


def power(a: Tensor, b: Tensor) -> Tensor:
    """a ** b elementwise."""
    return EWisePow()(a, b)


class PowerScalar(_ScalarOp):
    """a ** scalar."""

    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw1.ops.power_scalar: ``a ** scalar`` on the NDArray (a's dtype kept)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.power_scalar)
        return a ** self.scalar
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.power_scalar: out_grad * scalar * a ** (scalar - 1)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.power_scalar)
        a = node.inputs[0]
        return out_grad * (a ** (self.scalar - 1)) * self.scalar
        ### END YOUR SOLUTION


def power_scalar(a: Tensor, scalar: float) -> Tensor:
    """a ** scalar."""
    return PowerScalar(scalar)(a)


class EWiseDiv(TensorOp):
    """a / b elementwise."""

    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        """Exercise hw1.ops.divide: ``a / b`` on the NDArrays (NumPy's broadcasting and dtype
        rules)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.divide)
        return a / b
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        """Exercise hw1.ops.divide: (out_grad / b, -out_grad * a / b ** 2), each ``unbroadcast`` to
        its input's shape."""
        ### BEGIN YOUR SOLUTION (hw1.ops.divide)
        a, b = node.inputs
        grad_a = out_grad / b
        grad_b = -out_grad * a / (b * b)
        return unbroadcast(grad_a, a.shape), unbroadcast(grad_b, b.shape)
        ### END YOUR SOLUTION


def divide(a: Tensor, b: Tensor) -> Tensor:
    """a / b (broadcasting)."""
    return EWiseDiv()(a, b)


class DivScalar(_ScalarOp):
    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw1.ops.divide_scalar: ``a / scalar`` (a's floating dtype kept)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.divide_scalar)
        return a / self.scalar
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.divide_scalar: out_grad / scalar."""
        ### BEGIN YOUR SOLUTION (hw1.ops.divide_scalar)
        return out_grad / self.scalar
        ### END YOUR SOLUTION


def divide_scalar(a: Tensor, scalar: float) -> Tensor:
    """a / scalar."""
    return DivScalar(scalar)(a)


class Negate(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        return -a

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return -out_grad


def negate(a: Tensor) -> Tensor:
    """-a."""
    return Negate()(a)


class Log(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        return a.log()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.log: out_grad / a."""
        ### BEGIN YOUR SOLUTION (hw1.ops.log)
        return out_grad / node.inputs[0]
        ### END YOUR SOLUTION


def log(a: Tensor) -> Tensor:
    """Natural logarithm."""
    return Log()(a)


class Exp(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        return a.exp()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.exp: out_grad * exp(a) (``node`` is exp(a))."""
        ### BEGIN YOUR SOLUTION (hw1.ops.exp)
        return out_grad * node
        ### END YOUR SOLUTION


def exp(a: Tensor) -> Tensor:
    """e ** a."""
    return Exp()(a)


class ReLU(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        return a.maximum(0)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.relu: out_grad where the output is > 0, else 0; the mask is a constant
        (``Tensor.make_const``), so relu is not differentiated twice."""
        ### BEGIN YOUR SOLUTION (hw1.ops.relu)
        mask = node.realize_cached_data() > 0
        return out_grad * Tensor.make_const(mask)
        ### END YOUR SOLUTION


def relu(a: Tensor) -> Tensor:
    """max(a, 0)."""
    return ReLU()(a)


class Tanh(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        return a.tanh()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.tanh: out_grad * (1 - tanh(a) ** 2) (``node`` is tanh(a))."""
        ### BEGIN YOUR SOLUTION (hw1.ops.tanh)
        return out_grad * (1 - node * node)
        ### END YOUR SOLUTION


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    return Tanh()(a)


class Sigmoid(TensorOp):
    def compute(self, a: NDArray) -> NDArray:
        # 1 / (1 + e^-a) written as (1 + tanh(a/2)) / 2: no overflow for large |a|
        return ((a * 0.5).tanh() + 1) * 0.5

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return out_grad * node * (1 - node)


def sigmoid(a: Tensor) -> Tensor:
    """Logistic sigmoid 1 / (1 + e^-a)."""
    return Sigmoid()(a)


class Transpose(TensorOp):
    """Swap two axes (the last two by default), as in the course."""

    def __init__(self, axes: Optional[Tuple[int, int]] = None):
        if axes is not None and len(axes) != 2:
            raise ValueError(f"transpose swaps two axes, got axes={axes}")
        self.axes = axes

    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw1.ops.transpose: swap axes ``self.axes`` (default the last two) with
        ``NDArray.permute`` (a view); fewer than 2 dims or axes out of range: ValueError."""
        ### BEGIN YOUR SOLUTION (hw1.ops.transpose)
        nd = a.ndim
        if nd < 2:
            raise ValueError(f"transpose needs >= 2 dims, got shape {a.shape}")
        i, j = self.axes if self.axes is not None else (-2, -1)
        if not (-nd <= i < nd and -nd <= j < nd):
            raise ValueError(f"transpose: axes {self.axes} out of range for shape {a.shape}")
        order = list(range(nd))
        order[i], order[j] = order[j], order[i]
        return a.permute(order)
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.transpose: out_grad transposed back over the same axes."""
        ### BEGIN YOUR SOLUTION (hw1.ops.transpose)
        return transpose(out_grad, self.axes)
        ### END YOUR SOLUTION


def transpose(a: Tensor, axes: Optional[Tuple[int, int]] = None) -> Tensor:
    """Swap two axes (the last two when ``axes`` is None)."""
    return Transpose(axes)(a)


class Reshape(TensorOp):
    def __init__(self, shape: Tuple[int, ...]):
        self.shape = tuple(shape)

    def compute(self, a: NDArray) -> NDArray:
        """Exercise hw1.ops.reshape: ``a.reshape(self.shape)`` (one entry may be -1; NDArray.reshape
        copies when ``a`` is not compact)."""
        ### BEGIN YOUR SOLUTION (hw1.ops.reshape)
        return a.reshape(self.shape)
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """Exercise hw1.ops.reshape: out_grad reshaped to the input's shape."""
        ### BEGIN YOUR SOLUTION (hw1.ops.reshape)
        return reshape(out_grad, node.inputs[0].shape)
        ### END YOUR SOLUTION


def reshape(a: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """``a`` with a new shape (one entry may be -1)."""
    return Reshape(shape)(a)


class BroadcastTo(TensorOp):
    def __init__(self, shape: Tuple[int, ...]):
        self.shape = tuple(shape)

    def compute(self, a: NDArray) -> NDArray:
        return a.broadcast_to(self.shape)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        """``out_grad`` summed back to the input's shape: ``unbroadcast`` (hw1.ops.broadcast_to)."""
        return unbroadcast(out_grad, node.inputs[0].shape)


def broadcast_to(a: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """``a`` broadcast to ``shape`` (NumPy's rules)."""
    return BroadcastTo(shape)(a)


class MatMul(TensorOp):
    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return a @ b

    def gradient(self, out_grad: Tensor, node: Tensor
                 ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """Exercise hw1.ops.matmul: (out_grad @ b^T, a^T @ out_grad) with ``transpose`` of the last
        two axes, each ``unbroadcast`` to its input's shape (batched operands broadcast their
        leading axes); an input with requires_grad False gets None instead of a product."""
        ### BEGIN YOUR SOLUTION (hw1.ops.matmul)
        a, b = node.inputs
        grad_a = grad_b = None  # an input that needs no gradient costs no matmul
        if a.requires_grad:
            grad_a = unbroadcast(out_grad @ transpose(b), a.shape)
        if b.requires_grad:
            if b.ndim == 2 and a.ndim > 2:
                # fold the batch into rows: one (n, B*m) @ (B*m, p) product instead of B
                # rows counted, not -1: a zero-size axis leaves -1 undetermined
                n, p = b.shape
                rows = math.prod(a.shape[:-1])
                grad_b = transpose(reshape(a, (rows, n))) @ reshape(out_grad, (rows, p))
            else:
                grad_b = unbroadcast(transpose(a) @ out_grad, b.shape)
        return grad_a, grad_b
        ### END YOUR SOLUTION


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product; batch dimensions broadcast."""
    return MatMul()(a, b)


class Maximum(TensorOp):
    """Elementwise max(a, b); on ties the gradient goes to ``a``."""

    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return a.maximum(b)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        a, b = node.inputs
        mask = a.realize_cached_data() >= b.realize_cached_data()
        take_a = Tensor.make_const(mask.astype(out_grad.dtype))
        return (unbroadcast(out_grad * take_a, a.shape),
                unbroadcast(out_grad * (1 - take_a), b.shape))


def maximum(a: Tensor, b: Any) -> Tensor:
    """Elementwise maximum of a tensor with a tensor or a scalar."""
    if isinstance(b, Tensor):
        return Maximum()(a, b)
    return MaximumScalar(b)(a)


class MaximumScalar(_ScalarOp):
    def compute(self, a: NDArray) -> NDArray:
        return a.maximum(self.scalar)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        mask = node.inputs[0].realize_cached_data() >= self.scalar
        return out_grad * Tensor.make_const(mask.astype(out_grad.dtype))


def maximum_scalar(a: Tensor, scalar: float) -> Tensor:
    """max(a, scalar) elementwise."""
    return MaximumScalar(scalar)(a)


class Cast(TensorOp):
    """Convert to another dtype; the gradient is cast back."""

    def __init__(self, dtype: str):
        self.dtype = to_numpy_dtype(dtype).name

    def compute(self, a: NDArray) -> NDArray:
        return a.astype(self.dtype)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return cast(out_grad, node.inputs[0].dtype)


def cast(a: Tensor, dtype: str) -> Tensor:
    """``a`` converted to ``dtype``."""
    if a.dtype == to_numpy_dtype(dtype).name:
        return a
    if not is_floating(to_numpy_dtype(dtype)):
        with no_grad():  # integer/bool results never require a gradient
            return Cast(dtype)(a)
    return Cast(dtype)(a)


class Where(TensorOp):
    """cond ? a : b elementwise; ``cond`` is a constant boolean mask (broadcasting)."""

    def __init__(self, cond: NDArray):
        self.cond = cond

    def compute(self, a: NDArray, b: NDArray) -> NDArray:
        return array_api.where(self.cond, a, b)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, Tensor]:
        a, b = node.inputs
        zero = Tensor.make_const(out_grad.realize_cached_data() * 0)
        return (unbroadcast(Where(self.cond)(out_grad, zero), a.shape),
                unbroadcast(Where(self.cond)(zero, out_grad), b.shape))


def where(cond: Any, a: Tensor, b: Tensor) -> Tensor:
    """Elementwise select: ``a`` where ``cond`` is true, else ``b`` (cond gets no gradient)."""
    if isinstance(cond, Tensor):
        cond = cond.realize_cached_data()
    elif not isinstance(cond, NDArray):
        cond = array_api.array(cond, dtype="bool", device=a.device)
    return Where(cond.astype("bool"))(a, b)
