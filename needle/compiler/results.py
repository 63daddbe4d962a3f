"""How a compiled call names its results and leaf tensors so that a later call can find them:
``("arg", k)`` for argument k (a new object each call), else ``("obj", tensor)``."""
from typing import Any, List

from ..autograd import Tensor
from ..backend_ndarray import NDArray


def meta(a: NDArray) -> tuple:
    """What a guard compares for an array: shape, strides, offset, dtype, buffer size."""
    return (a.shape, a.strides, a.offset, a.dtype, a._handle.size)


def flatten(result: Any, tensors: List[Tensor]) -> Any:
    """A tree of ``result`` with each Tensor replaced by ('T', index into ``tensors``)."""
    if isinstance(result, Tensor):
        tensors.append(result)
        return ("T", len(tensors) - 1)
    if isinstance(result, (tuple, list)):
        return (type(result).__name__, [flatten(x, tensors) for x in result])
    return ("V", result)


def unflatten(tree: Any, tensors: List[Tensor]) -> Any:
    """The inverse of ``flatten``."""
    kind, val = tree
    if kind == "T":
        return tensors[val]
    if kind in ("tuple", "list"):
        items = [unflatten(x, tensors) for x in val]
        return tuple(items) if kind == "tuple" else items
    return val


def unpack(handles: List[Any], metas: List[tuple], device: Any) -> List[NDArray]:
    """NDArrays over a replay's output buffers, each with its (shape, strides, offset)."""
    return [NDArray.make(shape, strides=strides, device=device, handle=h, offset=off)
            for h, (shape, strides, off) in zip(handles, metas)]


def leaf_ref(leaf: Tensor, args: tuple) -> tuple:
    """("arg", k) when ``leaf`` is argument k (a new object each call), else ("obj", leaf)."""
    for k, a in enumerate(args):
        if a is leaf:
            return ("arg", k)
    return ("obj", leaf)


def resolve(ref: tuple, args: tuple) -> Tensor:
    """The tensor ``ref`` names in a call with ``args``."""
    return args[ref[1]] if ref[0] == "arg" else ref[1]


def source(role: tuple, args: tuple, leaves: List[Tensor]) -> Tensor:
    """The tensor an input buffer is read from in this call: ``("arg", k)``, ``("leaf", j)``
    or ``("attr", (object, name))`` (a tensor the function reads from an object, such as
    BatchNorm's running statistics: looked up again each call, as eager does)."""
    kind, j = role
    if kind == "arg":
        return args[j]
    if kind == "leaf":
        return leaves[j]
    return getattr(j[0], j[1])


WHY_NO_GRAPH = ("it is a result of a needle.compile'd function that calls backward() itself: "
                "such results carry no graph (that backward already set the .grad values); "
                "to call backward outside, return the loss without calling backward inside")


def graphless(data: NDArray) -> Tensor:
    """A constant result of a compiled function that called backward itself."""
    t = Tensor.make_const(data)
    t._why_no_graph = WHY_NO_GRAPH  # type: ignore[attr-defined]  # what backward() reports
    return t
