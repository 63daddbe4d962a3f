"""Operators on tuples of tensors: make_tuple, tuple_get_item, fused_add_scalars, stack, split."""
from typing import Sequence, Tuple, Union

from .. import backend_ndarray as array_api
from ..autograd import NDArray, Tensor, TensorOp, TensorTuple, TensorTupleOp

__all__ = ["MakeTensorTuple", "make_tuple", "TupleGetItem", "tuple_get_item", "FusedAddScalars",
           "fused_add_scalars", "Stack", "stack", "Split", "split"]


class MakeTensorTuple(TensorTupleOp):
    def compute(self, *args: NDArray) -> Tuple[NDArray, ...]:
        return tuple(args)

    def gradient(self, out_grad: TensorTuple, node: TensorTuple) -> Tuple[Tensor, ...]:
        if not isinstance(out_grad, TensorTuple):
            raise TypeError("the gradient of a tuple must be a TensorTuple")
        return tuple(out_grad[i] for i in range(len(out_grad)))


def make_tuple(*args: Tensor) -> TensorTuple:
    """A TensorTuple of the given tensors."""
    return MakeTensorTuple()(*args)


class TupleGetItem(TensorOp):
    def __init__(self, index: int):
        self.index = index

    def __call__(self, a: TensorTuple, fold_const: bool = True) -> Tensor:
        if not isinstance(a, TensorTuple):
            raise TypeError(f"tuple_get_item needs a TensorTuple, got {type(a).__name__}")
        # get_item(make_tuple(x0, x1, ...), i) is just x_i
        if fold_const and isinstance(a.op, MakeTensorTuple):
            return a.inputs[self.index]
        return Tensor.make_from_op(self, (a,))

    def compute(self, a: Tuple[NDArray, ...]) -> NDArray:
        return a[self.index]

    def gradient(self, out_grad: Tensor, node: Tensor) -> TensorTuple:
        in_grad = [Tensor.make_const(array_api.full(v.shape, 0, v.dtype, v.device))
                   for v in node.inputs[0].realize_cached_data()]
        in_grad[self.index] = out_grad
        return MakeTensorTuple()(*in_grad)


def tuple_get_item(value: TensorTuple, index: int) -> Tensor:
    """Element ``index`` of a TensorTuple."""
    return TupleGetItem(index)(value)


class FusedAddScalars(TensorTupleOp):
    """(a + c0, a + c1) in one op."""

    def __init__(self, c0: float, c1: float):
        self.c0 = c0
        self.c1 = c1

    def compute(self, a: NDArray) -> Tuple[NDArray, NDArray]:
        return a + self.c0, a + self.c1

    def gradient(self, out_grad: TensorTuple, node: TensorTuple) -> Tensor:
        return out_grad[0] + out_grad[1]


def fused_add_scalars(x: Tensor, c0: float, c1: float) -> TensorTuple:
    """(x + c0, x + c1)."""
    return FusedAddScalars(c0, c1)(x)


class Stack(TensorOp):
    """Join same-shaped tensors along a new ``axis``."""

    def __init__(self, axis: int):
        self.axis = axis

    def compute(self, args: Tuple[NDArray, ...]) -> NDArray:
        """Exercise hw4.ops.stack_split: the arrays (one shape) stacked along a new axis
        ``self.axis``."""
        ### BEGIN YOUR SOLUTION (hw4.ops.stack_split)
        return array_api.stack(args, self.axis)
        ### END YOUR SOLUTION

    def gradient(self, out_grad: Tensor, node: Tensor) -> TensorTuple:
        """Exercise hw4.ops.stack_split: ``split(out_grad, axis)``."""
        ### BEGIN YOUR SOLUTION (hw4.ops.stack_split)
        return split(out_grad, self.axis)
        ### END YOUR SOLUTION


def stack(args: Union[Sequence[Tensor], TensorTuple], axis: int) -> Tensor:
    """Stack a list/tuple of tensors along a new ``axis``."""
    return Stack(axis)(args if isinstance(args, TensorTuple) else make_tuple(*args))


class Split(TensorTupleOp):
    """Split along ``axis`` into ``shape[axis]`` tensors with that axis removed."""

    def __init__(self, axis: int):
        self.axis = axis

    def compute(self, A: NDArray) -> Tuple[NDArray, ...]:
        """Exercise hw4.ops.stack_split: the slices of ``A`` along ``self.axis`` (that axis
        removed), a tuple; axis out of range: ValueError."""
        ### BEGIN YOUR SOLUTION (hw4.ops.stack_split)
        if not -A.ndim <= self.axis < A.ndim:
            raise ValueError(f"split: axis {self.axis} out of range for shape {A.shape}")
        return array_api.split(A, self.axis)
        ### END YOUR SOLUTION

    def gradient(self, out_grad: TensorTuple, node: TensorTuple) -> Tensor:
        """Exercise hw4.ops.stack_split: ``stack(out_grad, axis)``."""
        ### BEGIN YOUR SOLUTION (hw4.ops.stack_split)
        return stack(out_grad, self.axis)
        ### END YOUR SOLUTION


def split(a: Tensor, axis: int) -> TensorTuple:
    """The slices of ``a`` along ``axis``."""
    return Split(axis)(a)
