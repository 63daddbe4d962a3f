"""``Parameter`` and ``Module``: the containers every layer is built from.

A Module finds its parameters, buffers and sub-modules by walking its attributes (and lists,
tuples and dicts of them), in attribute order, as the course's ``_unpack_params`` does.
Everything is deduplicated by identity, so a weight shared by two layers (tied embeddings) is
one parameter: listed once, updated once by an optimizer, saved once in a state_dict.

State dicts map dotted names (``"modules.0.weight"``) to **NumPy arrays** (copies), so a state
dict is a device-independent snapshot that ``ndl.save`` can write and any device can load.
"""
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple, TypedDict

import numpy as np

from ..autograd import Tensor
from ..backend_ndarray import BackendDevice, NDArray
from ..process_state import switches


class Parameter(Tensor):
    """A tensor that is a learnable parameter of a Module."""


class DeviceDtype(TypedDict):
    """The ``device=``, ``dtype=`` keywords a layer passes on to the layers it builds."""

    device: Optional[BackendDevice]
    dtype: str


class LoadResult(NamedTuple):
    """Keys that ``load_state_dict(strict=False)`` skipped."""

    missing_keys: List[str]
    unexpected_keys: List[str]


def _walk(value: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    """(name, item) for Modules, Parameters and Tensors found in attributes/containers."""
    if isinstance(value, (Module, Tensor)):
        yield prefix, value
    elif isinstance(value, (dict, list, tuple)):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))


class Module:
    """Base class of layers: holds Parameters, buffers and sub-Modules as attributes."""

    training = True
    _buffer_names: frozenset = frozenset()

    def __init__(self) -> None:
        self.training = True

    # ------------------------------------------------------------------ traversal
    def _items(self) -> Iterator[Tuple[str, Any]]:
        """Direct (name, Module|Tensor) attributes of this module."""
        for name, value in self.__dict__.items():
            yield from _walk(value, name)

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        """(name, module) for each direct sub-module, each module once."""
        seen: Set[int] = set()
        for name, value in self._items():
            if isinstance(value, Module) and id(value) not in seen:
                seen.add(id(value))
                yield name, value

    def children(self) -> List["Module"]:
        """The direct sub-modules."""
        return [m for _, m in self.named_children()]

    def _children(self) -> List["Module"]:
        """Every descendant module, not this one (the course's name for it)."""
        return [m for _, m in self.named_modules() if m is not self]

    def named_modules(self, prefix: str = "") -> Iterator[Tuple[str, "Module"]]:
        """(dotted name, module) for this module and every descendant, each once.

        PyTorch's ``modules()`` traversal lives here: the course's ``Sequential.modules`` is
        its list of layers (``model.modules[1].modules[0]``), and the course's name wins.
        """
        seen: Set[int] = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            kids = [(f"{name}.{n}" if name else n, m) for n, m in module.named_children()]
            stack.extend(reversed(kids))

    def _named_tensors(self, want_params: bool) -> Iterator[Tuple[str, Any]]:
        """Parameters (or buffers), depth-first in the course's ``_unpack_params`` order, once."""
        seen: Set[int] = set()
        stack: List[Tuple[str, Any, Any]] = [("", self, None)]
        while stack:
            name, value, owner = stack.pop()
            if id(value) in seen:
                continue
            if isinstance(value, Module):
                seen.add(id(value))
                items = [(f"{name}.{n}" if name else n, v, value) for n, v in value._items()]
                stack.extend(reversed(items))
                continue
            is_param = isinstance(value, Parameter)
            is_buffer = not is_param and name.rsplit(".", 1)[-1] in owner._buffer_names
            if (is_param and want_params) or (is_buffer and not want_params):
                seen.add(id(value))
                yield name, value

    def named_parameters(self) -> Iterator[Tuple[str, Parameter]]:
        """(dotted name, parameter) pairs, each parameter once (first name wins)."""
        return self._named_tensors(want_params=True)

    def parameters(self) -> List[Parameter]:
        """All parameters, deduplicated by identity, in attribute order."""
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name: str, tensor: Tensor) -> None:
        """Store ``tensor`` as attribute ``name``: saved in state_dict, not trained."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"buffer {name!r} must be a Tensor, got {type(tensor).__name__}")
        self._buffer_names = frozenset(self._buffer_names | {name})
        tensor.requires_grad = False
        setattr(self, name, tensor)

    def named_buffers(self) -> Iterator[Tuple[str, Tensor]]:
        """(dotted name, buffer) pairs, e.g. BatchNorm running statistics."""
        return self._named_tensors(want_params=False)

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> "Module":
        """Set training mode on this module and all descendants."""
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        """Set evaluation mode (BatchNorm uses running stats, Dropout is the identity)."""
        return self.train(False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if switches.profiler is not None:  # needle.profiler: a range named by module path
            return switches.profiler.module(self, args, kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's computation."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    # ------------------------------------------------------------------ state
    def _state_tensors(self) -> Dict[str, Tensor]:
        return dict([*self.named_parameters(), *self.named_buffers()])

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Parameters and buffers by dotted name, as NumPy copies."""
        return {k: t.numpy() for k, t in self._state_tensors().items()}

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> LoadResult:
        """Copy values into this module's parameters/buffers (keeping their device and dtype).

        With ``strict`` any missing or unexpected key is an error; a shape mismatch always is.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict expects a dict, got {type(state_dict).__name__}")
        own = self._state_tensors()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise ValueError(f"load_state_dict for {type(self).__name__}: missing keys "
                             f"{missing}, unexpected keys {unexpected}")
        new = {}
        for key, tensor in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if isinstance(value, Tensor):
                value = value.realize_cached_data()
            shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            if shape != tuple(tensor.shape):
                raise ValueError(f"load_state_dict: {key!r} has shape {shape} in the state "
                                 f"dict but {tuple(tensor.shape)} in the module")
            if not isinstance(value, NDArray):
                value = np.asarray(value)
            # a copy through Tensor: an NDArray, or a NumPy array under NEEDLE_BACKEND=np
            new[key] = Tensor(value, device=tensor.device, dtype=tensor.dtype,
                              requires_grad=False).realize_cached_data()
        for key, value in new.items():  # all checks passed: now assign
            own[key].cached_data = value
        return LoadResult(missing, unexpected)

    def to(self, device: Optional[BackendDevice] = None, dtype: Optional[str] = None) -> "Module":
        """Move (and/or cast) all parameters and buffers in place; tied weights stay tied."""
        for tensor in self._state_tensors().values():
            data = tensor.realize_cached_data()
            if (device is not None and data.device != device) or (
                    dtype is not None and data.dtype != dtype):
                tensor.cached_data = Tensor(data, device=device, dtype=dtype,
                                            requires_grad=False).realize_cached_data()
                tensor.grad = None
        return self

    def num_parameters(self) -> int:
        """Total number of scalar parameters (tied weights counted once)."""
        return sum(int(np.prod(p.shape)) for p in self.parameters())

    def __repr__(self) -> str:
        kids = [f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self.named_children()]
        extra = self.extra_repr()
        if not kids:
            return f"{type(self).__name__}({extra})"
        return f"{type(self).__name__}(" + (extra + "\n" if extra else "\n") + \
            "\n".join(kids) + "\n)"

    def extra_repr(self) -> str:
        """Constructor arguments shown by repr()."""
        return ""
