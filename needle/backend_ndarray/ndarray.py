"""NDArray: an n-dimensional strided view over a flat device buffer. Shape, stride and view
logic lives here; a backend supplies only the named primitives. Strides are in elements."""
import math
import operator
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .. import numbers as strict
from . import primitives
from .axes import check_axis, normalize_axes
from .device import BackendDevice, default_device
from .dtypes import bfloat16, is_floating, promote, to_numpy_dtype

_STRIDES: Dict[Tuple[int, ...], Tuple[int, ...]] = {}
_DTYPE_NAMES: Dict[np.dtype, str] = {}
_BOOL = np.dtype(np.bool_)
_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_COMPARISONS = primitives.COMPARISONS
Scalar = Union[int, float, bool, np.generic]
prod = math.prod  # the course's name for it
_INT_TYPES = frozenset((int,))


def _method(kind: str, name: str) -> Callable[..., "NDArray"]:
    """NDArray's method for the elementwise op ``name``: ``self.<kind>(other, name)``."""
    def binary(self: "NDArray", other: Any) -> "NDArray":
        return getattr(self, kind)(other, name)

    def unary(self: "NDArray") -> "NDArray":
        return self._unary(name)
    method: Callable[..., "NDArray"] = unary if kind == "_unary" else binary
    method.__name__ = name
    method.__doc__ = f"Elementwise ``{primitives.TABLE['ewise_' + name].formula()}``."
    return method


def _check_cast(src: Any, to: np.dtype) -> None:
    """Refuse a NumPy-to-integer conversion that NumPy would wrap silently: values outside the
    integer type's range (a uint64 of 2**63 read as int64 is -2**63), nan or inf."""
    if to.kind not in "iu" or src.size == 0 or np.can_cast(src.dtype, to, "safe"):
        return
    if src.dtype.kind not in "iub":
        with np.errstate(invalid="ignore"):
            finite = bool(np.isfinite(src).all()) if src.dtype.kind in "fc" or \
                src.dtype == bfloat16 else True
        if not finite:
            raise ValueError(f"cannot convert {src.dtype} nan or inf to {to.name}")
    lo, hi, info = src.min(), src.max(), np.iinfo(to)
    if lo < info.min or hi > info.max:
        raise ValueError(f"{src.dtype} values in [{lo}, {hi}] do not fit {to.name} "
                         f"([{info.min}, {info.max}])")


class NDArray:
    """A strided n-dimensional array on a device (course-compatible needle NDArray)."""

    __slots__ = ("_shape", "_strides", "_offset", "_device", "_handle", "shape", "dtype",
                 "__weakref__")
    _shape: Tuple[int, ...]
    # ``shape`` (== ``_shape``) and ``dtype`` (the dtype's name, e.g. "float32") are plain
    # attributes set where an NDArray is made (``make``, ``_init``), not properties: every op
    # reads them several times, and a property is a Python call each time.
    shape: Tuple[int, ...]
    dtype: str
    _strides: Tuple[int, ...]
    _offset: int
    _device: BackendDevice
    _handle: Any  # the device backend's flat buffer (its ``Array``)
    # Above NumPy's (0.0): ``np_array + nd_array`` and ``np_array == nd_array`` defer to our
    # reflected operators and return NDArrays, as ``nd_array + np_array`` does. No
    # ``__array_ufunc__``: NumPy functions (np.abs, np.linalg.norm) read us through __array__.
    __array_priority__ = 1000.0

    def __init__(self, other: Any, device: Optional[BackendDevice] = None, dtype: Any = None):
        """Create by copying ``other`` (NDArray, numpy array, list or scalar)."""
        if isinstance(other, NDArray):
            src = other.to(device) if device is not None else other
            if dtype is not None and to_numpy_dtype(dtype) != src._np_dtype:
                src = src.astype(dtype)
            elif src is other:
                src = NDArray.make(other._shape, device=other._device, dtype=other._np_dtype)
                other._device.compact(other._handle, src._handle, other._shape, other._strides,
                                      other._offset)  # a copy keeping the dtype (even bool)
            self._init(src)
            return
        device = device if device is not None else default_device()
        if not isinstance(device, BackendDevice):
            raise TypeError(f"device must be a needle BackendDevice (ndl.cpu(), ndl.cuda()), "
                            f"got {type(device).__name__} {device!r}")
        if not device.enabled():
            raise RuntimeError(f"device {device!r} is not enabled")
        if other is None:  # np.asarray(None, float32) is nan
            raise TypeError("cannot make an array of None: give a number, list or array")
        if dtype is not None and isinstance(other, (np.ndarray, np.generic)):
            _check_cast(other, to_numpy_dtype(dtype))
        arr = np.asarray(other) if dtype is None else np.asarray(other, dtype=to_numpy_dtype(dtype))
        np_dtype = to_numpy_dtype(arr.dtype if dtype is None else dtype)
        array = NDArray.make(arr.shape, device=device, dtype=np_dtype)
        device.from_numpy(np.ascontiguousarray(arr), array._handle)
        self._init(array)

    def _init(self, other: "NDArray") -> None:
        self._shape = self.shape = other._shape
        self.dtype = other.dtype
        self._strides = other._strides
        self._offset = other._offset
        self._device = other._device
        self._handle = other._handle

    @staticmethod
    def compact_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """Row-major strides of a compact array of ``shape``."""
        try:
            return _STRIDES[shape]
        except KeyError:
            pass
        res = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        if len(_STRIDES) < 4096:  # a cache: shapes repeat every training step
            _STRIDES[shape] = res
        return res

    @staticmethod
    def make(shape: Tuple[int, ...], strides: Optional[Tuple[int, ...]] = None,
             device: Optional[BackendDevice] = None, handle: Any = None, offset: int = 0,
             dtype: Any = None) -> "NDArray":
        """Build an NDArray over ``handle`` (a new buffer when None) without copying."""
        array = object.__new__(NDArray)
        if type(shape) is not tuple:
            shape = tuple(shape)
        array._shape = array.shape = shape
        array._strides = (_STRIDES.get(shape) or NDArray.compact_strides(shape)) \
            if strides is None else tuple(strides)
        array._offset = offset
        if device is None:
            device = default_device()
        array._device = device
        if handle is None:
            handle = device.Array(math.prod(shape), _F32 if dtype is None else (
                dtype if isinstance(dtype, np.dtype) else to_numpy_dtype(dtype)))
        array._handle = handle
        dt = handle.dtype  # its .name is slow: cached
        array.dtype = _DTYPE_NAMES.get(dt) or _DTYPE_NAMES.setdefault(dt, dt.name)
        return array

    # ------------------------------------------------------------------ properties
    @property
    def strides(self) -> Tuple[int, ...]:
        return self._strides

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def device(self) -> BackendDevice:
        return self._device

    @property
    def _np_dtype(self) -> np.dtype:
        return self._handle.dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return prod(self._shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements this view covers."""
        return self.size * self._handle.dtype.itemsize

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d NDArray")
        return self._shape[0]

    def __repr__(self) -> str:
        return "NDArray(" + self.numpy().__str__() + f", device={self.device})"

    def __str__(self) -> str:
        return self.numpy().__str__()

    # ------------------------------------------------------------------ basics
    def fill(self, value: Scalar) -> None:
        """Fill (in place) with a constant value."""
        _written(self._handle)
        self._device.fill(self._handle, value)

    def to(self, device: BackendDevice) -> "NDArray":
        """This array on ``device`` (itself when already there)."""
        if device == self._device:
            return self
        return NDArray(self.numpy(), device=device, dtype=self._np_dtype)

    def numpy(self) -> np.ndarray:
        """A NumPy copy."""
        return self._device.to_numpy(self._handle, self._shape, self._strides, self._offset)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule over this array's memory: ``torch.from_dlpack(a)`` shares it."""
        from . import dlpack
        return dlpack.export(self, stream=stream, max_version=max_version, dl_device=dl_device,
                             copy=copy)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(DLDeviceType, device id): (1, 0) on the CPU, (2, index) on CUDA."""
        from . import dlpack
        return dlpack.device_of(self)

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """NumPy's array protocol (CPU only): ``np.array(a)``, ``np.linalg.norm(a)`` copy."""
        if self._device.name != "cpu":
            # as CuPy: no silent device-to-host copies; ask for them with .numpy()
            raise TypeError(f"implicit conversion of a {self._device!r} NDArray to NumPy is "
                            "not allowed: call .numpy()")
        if copy is False:
            raise ValueError("NDArray.__array__ always copies (copy=False was requested)")
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    @property
    def flat(self) -> "NDArray":
        """The elements as a 1-D array (the course's ``reshape((size,))``): a view that writes
        through when compact, so ``x.flat[j] += eps`` changes ``x``; a copy otherwise."""
        return self.reshape((self.size,))

    def astype(self, dtype: Any) -> "NDArray":
        """A copy converted to ``dtype`` (itself when the dtype already matches)."""
        np_dtype = dtype if isinstance(dtype, np.dtype) else to_numpy_dtype(dtype)
        if np_dtype == self._handle.dtype:
            return self
        out = NDArray.make(self._shape, device=self._device, dtype=np_dtype)
        self._device.ewise_astype(self.compact()._handle, out._handle)
        return out

    def is_compact(self) -> bool:
        """True when the view is row-major contiguous from the start of its buffer."""
        shape = self._shape
        return (self._strides == (_STRIDES.get(shape) or NDArray.compact_strides(shape))
                and math.prod(shape) == self._handle.size)

    def compact(self) -> "NDArray":
        """A compact copy (or itself when already compact)."""
        shape = self._shape
        if (self._strides == (_STRIDES.get(shape) or NDArray.compact_strides(shape))
                and math.prod(shape) == self._handle.size):  # is_compact(), inline: every op
            return self
        out = NDArray.make(self._shape, device=self._device, dtype=self._np_dtype)
        self._device.compact(self._handle, out._handle, self._shape, self._strides, self._offset)
        return out

    def as_strided(self, shape: Tuple[int, ...], strides: Tuple[int, ...]) -> "NDArray":
        """A view with the given shape and strides over the same buffer."""
        if len(shape) != len(strides):
            raise ValueError(f"as_strided: shape {shape} and strides {strides} differ in length")
        return NDArray.make(shape, strides=strides, device=self._device, handle=self._handle,
                            offset=self._offset)

    # ------------------------------------------------------------------ views
    def reshape(self, new_shape: Union[int, Sequence[int]]) -> "NDArray":
        """Same data in ``new_shape`` (one entry may be -1): a view when compact, else a copy."""
        new_shape = _normalize_shape(new_shape, self.size, self._shape)
        ### BEGIN YOUR SOLUTION (hw3.ndarray.views)
        if new_shape == self._shape:
            return self
        src = self.compact()
        return NDArray.make(new_shape, device=self._device, handle=src._handle,
                            offset=src._offset)
        ### END YOUR SOLUTION

    def permute(self, new_axes: Sequence[int]) -> "NDArray":
        """A view with axes reordered: out.shape[i] == self.shape[new_axes[i]]."""
        nd, axes = len(self._shape), tuple(new_axes)
        if sorted(axes) != list(range(nd)):  # negative or invalid axes: normalise, then check
            axes = tuple([check_axis(a, nd, "permute") for a in new_axes])
            if sorted(axes) != list(range(nd)):
                raise ValueError(f"permute: axes {tuple(new_axes)} are not a permutation of "
                                 f"range({nd}) for shape {self._shape}")
        ### BEGIN YOUR SOLUTION (hw3.ndarray.views)
        return NDArray.make(tuple(map(self._shape.__getitem__, axes)),
                            strides=tuple(map(self._strides.__getitem__, axes)),
                            device=self._device, handle=self._handle, offset=self._offset)
        ### END YOUR SOLUTION

    def broadcast_to(self, new_shape: Sequence[int]) -> "NDArray":
        """A view broadcast to ``new_shape`` (stride 0 on broadcast axes; NumPy's rules)."""
        new_shape = tuple(new_shape)
        if new_shape == self._shape:
            return self
        for n in new_shape:  # (no call unless a size is not a plain int >= 0)
            if type(n) is not int or n < 0:
                new_shape = _dims("broadcast_to", new_shape)
                break
        lead = len(new_shape) - self.ndim
        if lead < 0:
            raise ValueError(f"cannot broadcast shape {self._shape} to {new_shape}")
        ### BEGIN YOUR SOLUTION (hw3.ndarray.views)
        strides = [0] * lead
        for i, (old, st) in enumerate(zip(self._shape, self._strides)):
            new = new_shape[lead + i]
            if old == new:
                strides.append(st)
            elif old == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {self._shape} to {new_shape}")
        return NDArray.make(new_shape, strides=tuple(strides), device=self._device,
                            handle=self._handle, offset=self._offset)
        ### END YOUR SOLUTION

    def flip(self, axes: Union[None, int, Sequence[int]] = None) -> "NDArray":
        """A compact copy with the order of elements reversed along ``axes`` (all when None).

        Made from a view: a negative stride on each flipped axis, the offset moved to that
        axis's last element; then compacted."""
        axes = normalize_axes(axes, self.ndim, "flip")
        ### BEGIN YOUR SOLUTION (hw3.ndarray.flip)
        strides = list(self._strides)
        offset = self._offset
        for a in axes:
            if self._shape[a] > 0:
                offset += (self._shape[a] - 1) * strides[a]
            strides[a] = -strides[a]
        view = NDArray.make(self._shape, strides=tuple(strides), device=self._device,
                            handle=self._handle, offset=offset)
        return view.compact()
        ### END YOUR SOLUTION

    def pad(self, axes: Sequence[Tuple[int, int]], value: Scalar = 0) -> "NDArray":
        """Pad with ``value``: ``axes[i] = (before, after)`` for axis i."""
        if len(axes) != self.ndim:
            raise ValueError(f"pad: got {len(axes)} (before, after) pairs for shape {self._shape}")
        pairs = [_dims("pad", pair, lo=None, what="padding") for pair in axes]  # (< 0: below)
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"pad: each axis needs a (before, after) pair, got {tuple(axes)}")
        axes = [(lo, hi) for lo, hi in pairs]
        if any(lo < 0 or hi < 0 for lo, hi in axes):
            raise ValueError(f"pad: negative padding {tuple(axes)}")
        new_shape = tuple(s + lo + hi for s, (lo, hi) in zip(self._shape, axes))
        out = NDArray.make(new_shape, device=self._device, dtype=self._np_dtype)
        out.fill(value)
        out[tuple(slice(lo, lo + s) for s, (lo, _) in zip(self._shape, axes))] = self
        return out

    # ------------------------------------------------------------------ indexing
    def process_slice(self, sl: slice, dim: int) -> slice:
        """Normalise a slice against axis ``dim`` into explicit (start, stop, step)."""
        start, stop, step = sl.indices(self._shape[dim])
        return slice(start, stop, step)

    def _view_of(self, idxs: Any) -> "NDArray":
        """Exercise hw3.ndarray.views (with the ellipsis and padding done above): the view that
        ``idxs`` (one int or slice per axis) selects, sharing the handle: each slice keeps its axis
        (length ``len(range(*idx.indices(n)))``, stride times step, offset moved to start when not
        empty); each int drops its axis (offset moved; out of range: IndexError)."""
        if not isinstance(idxs, tuple):
            idxs = (idxs,)
        if any(i is Ellipsis for i in idxs):
            k = idxs.index(Ellipsis)
            fill = self.ndim - (len(idxs) - 1)
            idxs = idxs[:k] + (slice(None),) * fill + idxs[k + 1:]
        if len(idxs) > self.ndim:
            raise IndexError(f"too many indices ({len(idxs)}) for shape {self._shape}")
        idxs = idxs + (slice(None),) * (self.ndim - len(idxs))
        ### BEGIN YOUR SOLUTION (hw3.ndarray.views)
        shape, strides, offset = [], [], self._offset
        for dim, idx in enumerate(idxs):
            n = self._shape[dim]
            if isinstance(idx, slice):
                start, stop, step = idx.indices(n)
                length = len(range(start, stop, step))
                if length > 0:
                    offset += start * self._strides[dim]
                shape.append(length)
                strides.append(self._strides[dim] * step)
            else:
                try:
                    i = operator.index(idx)
                except TypeError:
                    raise TypeError(f"NDArray indices must be ints or slices, got "
                                    f"{type(idx).__name__}") from None
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
                offset += (i % n) * self._strides[dim]
        return NDArray.make(tuple(shape), strides=tuple(strides), device=self._device,
                            handle=self._handle, offset=offset)
        ### END YOUR SOLUTION

    def __getitem__(self, idxs: Any) -> "NDArray":
        """A view for int/slice (with steps, negatives, Ellipsis) indices; ints drop the axis."""
        return self._view_of(idxs)

    def __setitem__(self, idxs: Any, other: Union["NDArray", Scalar]) -> None:
        """Write an NDArray (broadcast to the view's shape) or a scalar into the indexed view."""
        view = self._view_of(idxs)
        _written(self._handle)
        if isinstance(other, NDArray):
            _check_device(self, other, "setitem")
            try:
                src = other.broadcast_to(view.shape)
            except ValueError:
                raise ValueError(f"setitem: value of shape {other.shape} does not fit the "
                                 f"indexed shape {view.shape}") from None
            src = src.astype(self._np_dtype).compact()
            self._device.ewise_setitem(src._handle, self._handle, view._shape, view._strides,
                                       view._offset)
        else:
            self._device.scalar_setitem(view.size, other, self._handle, view._shape,
                                        view._strides, view._offset)

    # ------------------------------------------------------------------ elementwise
    def _binary(self, other: Any, name: str) -> "NDArray":
        dev = self._device
        if isinstance(other, NDArray):
            if other._device is not dev and other._device != dev:
                _check_device(self, other, name)
            a, b = self, other
            dt = a._handle.dtype
            if b._handle.dtype != dt:
                dt = promote(dt, b._handle.dtype)
                a, b = a.astype(dt), b.astype(dt)
            if a._shape != b._shape:
                shape = broadcast_shapes(a._shape, b._shape, name)
                a, b = a.broadcast_to(shape), b.broadcast_to(shape)
            out = NDArray.make(a._shape, device=dev, dtype=_out_dtype(name, dt))
            strided = None if a.is_compact() and b.is_compact() else getattr(
                dev, "ewise_strided", None)
            if strided is not None:
                # read broadcast/transposed operands in place: no full-size compact copy
                strided(name, a._handle, (a._shape, a._strides, a._offset), b._handle,
                        (b._shape, b._strides, b._offset), out._handle)
            else:
                getattr(dev, _EWISE[name])(a.compact()._handle, b.compact()._handle,
                                           out._handle)
            return out
        if isinstance(other, np.ndarray):
            return self._binary(NDArray(other, device=dev), name)
        if not isinstance(other, (int, float, bool, np.generic)):
            raise TypeError(f"unsupported operand type for {name}: NDArray and "
                            f"{type(other).__name__}")
        dt = self._handle.dtype
        src = self
        if dt.kind in "biu":  # an int/bool array may compute in another dtype (NEP 50)
            dt = _scalar_dtype(dt, other, name)
            src = self.astype(dt)  # itself when the dtype is unchanged
        out = NDArray.make(self._shape, device=dev, dtype=_out_dtype(name, dt))
        getattr(dev, _SCALAR[name])(src.compact()._handle, other, out._handle)
        return out

    def _rbinary(self, other: Any, name: str) -> "NDArray":
        """``other <name> self`` for a scalar or numpy ``other``."""
        if isinstance(other, np.ndarray):
            return NDArray(other, device=self._device)._binary(self, name)
        dt = _scalar_dtype(self._np_dtype, other, name)
        scalar = NDArray.make((), device=self._device, dtype=dt)
        scalar.fill(other)
        return scalar._binary(self, name)

    # The operators, each a call of _binary, _rbinary, _inplace or _unary (see _method)
    __add__ = __radd__ = _method("_binary", "add")
    __sub__, __rsub__ = _method("_binary", "sub"), _method("_rbinary", "sub")
    __mul__ = __rmul__ = _method("_binary", "mul")
    __truediv__, __rtruediv__ = _method("_binary", "div"), _method("_rbinary", "div")
    __pow__, __rpow__ = _method("_binary", "pow"), _method("_rbinary", "pow")
    __neg__, __abs__ = _method("_unary", "neg"), _method("_unary", "abs")
    maximum = _method("_binary", "maximum")
    __eq__, __ne__ = _method("_binary", "eq"), _method("_binary", "ne")
    __lt__, __le__ = _method("_binary", "lt"), _method("_binary", "le")
    __gt__, __ge__ = _method("_binary", "gt"), _method("_binary", "ge")
    __hash__ = object.__hash__

    # In-place forms (``a += b``) write into ``a``'s own buffer when ``a`` is compact and the
    # result has its shape and dtype (elementwise primitives allow ``out`` to alias an input);
    # otherwise they fall back to the out-of-place result. Optimizers use them for their state.
    def _inplace(self, other: Any, name: str) -> "NDArray":
        if not self.is_compact():
            return self._binary(other, name)
        _written(self._handle)
        dev, dt = self._device, self._handle.dtype
        if isinstance(other, NDArray):
            if other._device != dev or other._shape != self._shape or other._handle.dtype != dt:
                return self._binary(other, name)
            getattr(dev, _EWISE[name])(self._handle, other.compact()._handle, self._handle)
        elif _keeps_dtype(dt, other, name):
            getattr(dev, _SCALAR[name])(self._handle, other, self._handle)
        else:
            return self._binary(other, name)
        return self

    __iadd__, __isub__ = _method("_inplace", "add"), _method("_inplace", "sub")
    __imul__, __itruediv__ = _method("_inplace", "mul"), _method("_inplace", "div")

    def _unary(self, name: str) -> "NDArray":
        dt = self._handle.dtype
        if name not in ("neg", "abs") and not is_floating(dt):
            dt = _F32
            src = self.astype(dt)
        else:
            src = self
        out = NDArray.make(self._shape, device=self._device, dtype=dt)
        getattr(self._device, "ewise_" + name)(src.compact()._handle, out._handle)
        return out

    # one method per unary row of primitives.ELEMENTWISE but neg (which is __neg__)
    log, exp, tanh, sqrt, abs, sin, cos = (
        _method("_unary", n) for n in primitives.EWISE_UNARY if n != "neg")

    # ------------------------------------------------------------------ matmul
    def __matmul__(self, other: "NDArray") -> "NDArray":
        """Matrix product; leading (batch) dimensions broadcast by NumPy's rules."""
        if not isinstance(other, NDArray):
            raise TypeError(f"matmul needs two NDArrays, got {type(other).__name__}")
        _check_device(self, other, "matmul")
        if len(self._shape) < 2 or len(other._shape) < 2:
            raise ValueError(f"matmul needs arrays with >= 2 dims, got shapes {self._shape} "
                             f"and {other._shape}")
        m, n = self._shape[-2:]
        n2, p = other._shape[-2:]
        if n != n2:
            raise ValueError(f"matmul: inner dimensions differ for shapes {self._shape} @ "
                             f"{other._shape}")
        a, b = self, other
        if a._handle.dtype != b._handle.dtype:
            dt = promote(a._handle.dtype, b._handle.dtype)
            a, b = a.astype(dt), b.astype(dt)
        ### BEGIN YOUR SOLUTION (hw3.ndarray.matmul)
        if len(a._shape) == 2 and len(b._shape) == 2:
            if getattr(self._device, "TILED_MATMUL", False):
                t = self._device.__tile_size__
                if m % t == 0 and n % t == 0 and p % t == 0:
                    return a._matmul_tiled(b, t)
            out = NDArray.make((m, p), device=self._device, dtype=a._handle.dtype)
            ha, ta = a._matmul_operand()
            hb, tb = b._matmul_operand()
            self._device.matmul(ha, hb, out._handle, 1, m, n, p, ta, tb)
            return out
        if len(b._shape) == 2:
            # (..., m, n) @ (n, p): fold the batch into the rows, one big GEMM
            lead = a._shape[:-2]
            flat = a.compact().reshape((prod(lead) * m, n))
            return (flat @ b).reshape(lead + (m, p))
        try:
            batch_shape = broadcast_shapes(a._shape[:-2], b._shape[:-2], "matmul")
        except ValueError:
            raise ValueError(f"matmul: batch dimensions of {self._shape} @ {other._shape} "
                             "cannot be broadcast together") from None
        ha, ta = a.broadcast_to(batch_shape + (m, n))._matmul_operand()
        hb, tb = b.broadcast_to(batch_shape + (n, p))._matmul_operand()
        out = NDArray.make(batch_shape + (m, p), device=self._device, dtype=a._handle.dtype)
        self._device.matmul(ha, hb, out._handle, prod(batch_shape), m, n, p, ta, tb)
        return out
        ### END YOUR SOLUTION

    def _tiled(self, t: int) -> "NDArray":
        """(rows, cols) -> compact (rows/t, cols/t, t, t): block (I, J) holds rows
        I*t..I*t+t-1 and cols J*t..J*t+t-1 (the layout of the backend's ``matmul_tiled``)."""
        rows, cols = self._shape
        rs, cs = self._strides
        return self.as_strided((rows // t, cols // t, t, t), (rs * t, cs * t, rs, cs)).compact()

    def _matmul_tiled(self, other: "NDArray", t: int) -> "NDArray":
        """2-D matmul through the device's ``matmul_tiled`` (the course's route).

        ``__matmul__`` takes it when the device offers it and m, n, p are all multiples of the
        tile size ``t``: each operand laid out as (rows/t, cols/t, t, t) tiles (``_tiled``)."""
        (m, n), p = self._shape, other._shape[1]
        ### BEGIN YOUR SOLUTION (hw3.ndarray.matmul_tiled)
        out = NDArray.make((m // t, p // t, t, t), device=self._device, dtype=self._np_dtype)
        self._device.matmul_tiled(self._tiled(t)._handle, other._tiled(t)._handle, out._handle,
                                  m, n, p)
        return out.permute((0, 2, 1, 3)).compact().reshape((m, p))
        ### END YOUR SOLUTION

    def _matmul_operand(self) -> Tuple[Any, bool]:
        """(buffer, transposed) for matmul: a compact array, or the last-two-axes transpose of
        one (what gradients produce), passed to BLAS with a flag instead of being copied."""
        if self.is_compact():
            return self._handle, False
        shape = self._shape
        if len(shape) >= 2 and self._offset == 0 and math.prod(shape) == self._handle.size:
            swapped = shape[:-2] + (shape[-1], shape[-2])
            st = NDArray.compact_strides(swapped)
            if self._strides == st[:-2] + (st[-1], st[-2]):
                return self._handle, True
        return self.compact()._handle, False

    # ------------------------------------------------------------------ reductions
    def _reduce(self, axis: Union[None, int, Sequence[int]], keepdims: bool, name: str
                ) -> "NDArray":
        """Exercise hw3.ndarray.reductions (the general case): ``name`` ('sum' or 'max') over
        ``axes`` into ``out``: permute the reduced axes last, compact, and let the device
        primitive reduce each contiguous block; an empty input gives zeros (sum)."""
        shape = self._shape
        ndim = len(shape)
        if type(axis) is tuple and len(axis) == 1:
            axis = axis[0]
        if type(axis) is int and -ndim <= axis < ndim:
            first = last = axis % ndim
            axes = (first,)
        else:
            axes = normalize_axes(axis, ndim, name)
            first, last = (axes[0], axes[-1]) if axes else (0, -1)
        dt = self._handle.dtype
        if name == "sum" and dt.kind in "bu":
            dt = _I64
        if axes and last - first == len(axes) - 1 and self.size:
            out = self._reduce_consecutive(first, last, dt, name)
        else:
            out = NDArray.make(tuple(s for i, s in enumerate(shape) if i not in axes),
                               device=self._device, dtype=dt)
            ### BEGIN YOUR SOLUTION (hw3.ndarray.reductions)
            if out.size == 0 or self.size == 0:  # nothing to reduce, or an empty sum
                if out.size:
                    out.fill(0)
            else:
                # move the reduced axes last: each output element reduces one contiguous block
                keep = tuple(i for i in range(ndim) if i not in axes)
                src = self.permute(keep + axes).compact().astype(dt)
                getattr(self._device, _REDUCE[name])(src._handle, out._handle,
                                                      math.prod(shape[i] for i in axes))
            ### END YOUR SOLUTION
        if keepdims:
            out = out.reshape(tuple(1 if i in axes else s for i, s in enumerate(shape)))
        return out

    def _reduce_consecutive(self, first: int, last: int, dt: np.dtype, name: str) -> "NDArray":
        """Reduce the consecutive axes ``first..last`` of a non-empty array with no transposing
        copy: the compact array viewed as (outer, reduce, inner), the backend reduces the
        middle axis."""
        shape = self._shape
        out = NDArray.make(shape[:first] + shape[last + 1:], device=self._device, dtype=dt)
        src = self.compact()
        if src._handle.dtype != dt:
            src = src.astype(dt)
        reduce_fn = getattr(self._device, _REDUCE[name])
        inner = math.prod(shape[last + 1:])
        reduce_size = math.prod(shape[first:last + 1])
        if inner == 1:
            reduce_fn(src._handle, out._handle, reduce_size)
        else:
            reduce_fn(src._handle, out._handle, reduce_size, inner)
        return out

    def sum(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False
            ) -> "NDArray":
        """Sum over ``axis`` (an int, a tuple of ints, or None for all)."""
        return self._reduce(axis, keepdims, "sum")

    def max(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False
            ) -> "NDArray":
        """Max over ``axis`` (an int, a tuple of ints, or None for all)."""
        if any(self._shape[a] == 0 for a in normalize_axes(axis, self.ndim, "max")):
            raise ValueError(f"max over a zero-size axis of shape {self._shape}")
        return self._reduce(axis, keepdims, "max")


# ---------------------------------------------------------------------- helpers
_EWISE = {n: "ewise_" + n for n in primitives.EWISE_BINARY}
_SCALAR = {n: "scalar_" + n for n in primitives.EWISE_BINARY}
_REDUCE = {"sum": "reduce_sum", "max": "reduce_max"}


def _out_dtype(name: str, dt: np.dtype) -> np.dtype:
    if name in _COMPARISONS:
        return _BOOL
    if name == "div" and not is_floating(dt):
        return _F32
    return dt


def _scalar_dtype(dt: np.dtype, scalar: Any, name: str) -> np.dtype:
    """Array dtype kept for python scalars (NEP 50), except a float scalar on an int array."""
    if not is_floating(dt) and name not in _COMPARISONS:
        if isinstance(scalar, (float, np.floating)):
            return _F32
        if dt == _BOOL and not isinstance(scalar, (bool, np.bool_)):
            return _I64  # NumPy: a bool array with an int scalar computes in int64
    return dt


def _keeps_dtype(dt: np.dtype, scalar: Any, name: str) -> bool:
    """True when ``array(dt) <name> scalar`` has dtype ``dt`` (so it can be done in place)."""
    if not isinstance(scalar, (int, float, np.generic)) or isinstance(scalar, (bool, np.bool_)):
        return False
    return _out_dtype(name, _scalar_dtype(dt, scalar, name)) == dt


def _written(handle: Any) -> None:
    """``handle`` is about to be written in place: what a backend knew of its values is gone."""
    if getattr(handle, "known_range", None) is not None:
        handle.known_range = None


def _check_device(a: NDArray, b: NDArray, what: str) -> None:
    if a._device is not b._device and a._device != b._device:
        raise ValueError(f"{what}: arrays are on different devices ({a.device} and {b.device})")


def broadcast_shapes(a: Tuple[int, ...], b: Tuple[int, ...], what: str = "op") -> Tuple[int, ...]:
    """NumPy's broadcast of two shapes, or a ValueError naming both."""
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(f"{what}: shapes {a} and {b} cannot be broadcast together") from None


def _dims(op: str, shape: Any, lo: Optional[int] = 0, what: str = "size") -> Tuple[int, ...]:
    """``shape`` as a tuple of whole sizes >= lo: int() read '6' as 6, True as 1 and 1.5 as 1,
    and a negative size made an array that failed only when read."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"{op}: the shape must be a sequence of ints, got "
                        f"{type(shape).__name__} {shape!r}")
    return tuple([strict.count_arg(n, f"{op}: {what}", lo=lo) for n in shape])


def _normalize_shape(new_shape: Union[int, Sequence[int]], size: int,
                     old: Tuple[int, ...]) -> Tuple[int, ...]:
    if type(new_shape) is tuple and _INT_TYPES.issuperset(map(type, new_shape)) and \
            prod(new_shape) == size and (not new_shape or min(new_shape) >= 0):
        return new_shape  # the common case, checked without a Python-level loop
    shape = (new_shape,) if isinstance(new_shape, int) else _dims("reshape", new_shape, lo=-1)
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one -1 allowed in {shape}")
    if -1 in shape:
        known = prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of shape {old} into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if prod(shape) != size or any(s < 0 for s in shape):
        raise ValueError(f"cannot reshape array of shape {old} (size {size}) into {shape}")
    return shape
