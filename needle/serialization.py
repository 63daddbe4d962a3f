"""Checkpoints: ``ndl.save(obj, path)`` / ``ndl.load(path)`` without pickle, written atomically.

File layout (safetensors-style, https://github.com/huggingface/safetensors):

    8 bytes   magic  b"NDLCKPT1"
    8 bytes   little-endian uint64 length H of the header
    H bytes   UTF-8 JSON header: {"tree": <structure>, "arrays": [{dtype, shape, offset, nbytes}]}
    ...       the raw little-endian bytes of every array, in header order

Every array's entry carries the CRC-32 of its bytes and its leaf's path ("obj['w']"), the
header the CRC-32 of its tree and table, so a flipped byte is refused naming the file and the
array; a file without them loads only with ``verify=False``. The tree is JSON whose array leaves
point into the table: loading parses JSON and copies bytes, so nothing in the file runs code,
and trusts no number in it (``_check_table``, ``_Arrays``): every failure is a
``CheckpointError`` naming the file. Dtypes are exact (bfloat16 by name), floats ``float.hex``.
A save is atomic (``atomic_file.py``).
"""
import io
import json
import math
import os
import struct
import zlib
from typing import Any, BinaryIO, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .atomic_file import write_atomic
from .autograd import Tensor
from .backend_ndarray.device import BackendDevice
from .backend_ndarray.dtypes import to_numpy_dtype
from .backend_ndarray.ndarray import NDArray

MAGIC = b"NDLCKPT1"
_ALIGN = 64  # array payloads start on 64-byte boundaries (friendly to mmap / SIMD loads)
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16",
           "int32", "uint32", "int64", "uint64", "bool")
_PICKLE_PREFIXES = (b"\x80", b"(dp", b"(lp", b"(S'", b"cnumpy", b"c__builtin__")


class CheckpointError(ValueError):
    """A file that is not a valid needle checkpoint (wrong format, truncated, or unsafe)."""


# ---------------------------------------------------------------------------- encoding
# checked in order, with isinstance (bool before int; a NumPy float64 is a float)
_SCALARS = ((bool, "const"), (str, "const"), (int, "int"), (float, "float"), (bytes, "bytes"))
_ARRAY_KINDS = ((Tensor, "tensor"), (NDArray, "ndarray"), (np.ndarray, "numpy"),
                (np.generic, "npscalar"))


def _encode(obj: Any, arrays: List[Tuple[str, np.ndarray]], path: str,
            inside: Tuple[int, ...] = ()) -> Any:
    """The JSON node for ``obj``; array leaves are appended to ``arrays``. ``inside``: the ids
    of the containers on the way here (a container inside itself recursed until RecursionError)."""
    if obj is None:
        return {"t": "const", "v": None}
    for cls, kind in _SCALARS:
        if isinstance(obj, cls):
            return _encode_scalar(obj, kind)
    for cls, kind in _ARRAY_KINDS:
        if isinstance(obj, cls):
            return _encode_leaf(obj, kind, arrays, path)
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in inside:
            raise ValueError(f"ndl.save: {path} contains itself (a cycle cannot be stored)")
        inside += (id(obj),)
    if isinstance(obj, dict):
        return {"t": "dict", "v": [[_key(k, path), _encode(v, arrays, f"{path}[{k!r}]", inside)]
                                   for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {"t": kind, "v": [_encode(v, arrays, f"{path}[{i}]", inside)
                                 for i, v in enumerate(obj)]}
    raise TypeError(f"ndl.save: cannot store {type(obj).__name__} at {path}; checkpoints hold "
                    "dicts/lists/tuples of Tensors, NDArrays, numpy arrays, numbers, str, None")


def _encode_scalar(obj: Any, kind: str) -> Dict:
    """A bool/str/int (stored as is) or a float/bytes (stored as exact hex)."""
    return {"t": kind, "v": obj.hex() if kind in ("float", "bytes") else obj}


def _encode_leaf(obj: Any, kind: str, arrays: List[Tuple[str, np.ndarray]], path: str) -> Dict:
    """A Tensor, NDArray, NumPy array or NumPy scalar, as an entry of the array table."""
    arr = obj.numpy() if kind in ("tensor", "ndarray") else np.asarray(obj)
    name = arr.dtype.name
    if name not in _DTYPES:
        raise TypeError(f"ndl.save: unsupported array dtype {name!r}; supported: {_DTYPES}")
    little = arr if arr.dtype.byteorder != ">" else arr.astype(arr.dtype.newbyteorder("<"))
    arrays.append((path, little if little.flags.c_contiguous else little.copy(order="C")))
    extra = {"requires_grad": obj.requires_grad} if kind == "tensor" else {}
    return {"t": kind, "v": len(arrays) - 1, **extra}


def _key(k: Any, path: str) -> Any:
    """A dict key, which must be str or int (JSON keeps those exactly)."""
    if not isinstance(k, (str, int)) or isinstance(k, bool):
        raise TypeError(f"ndl.save: dict keys must be str or int, got {k!r} at {path}")
    return k


def _crc(a: np.ndarray) -> int:
    """CRC-32 of a C-contiguous array's bytes."""
    return zlib.crc32(a.reshape(-1).view(np.uint8).data)


def _header_crc(tree: Any, table: List[Dict]) -> int:
    """CRC-32 of the header's tree and table, as JSON (stable: loading keeps key order)."""
    return zlib.crc32(json.dumps({"tree": tree, "arrays": table},
                                 separators=(",", ":")).encode())


def _header(tree: Any, arrays: List[Tuple[str, np.ndarray]]) -> Tuple[bytes, List[int]]:
    table, offsets, pos = [], [], 0
    for leaf, a in arrays:
        pos = -(-pos // _ALIGN) * _ALIGN
        table.append({"dtype": a.dtype.name, "shape": list(a.shape), "offset": pos,
                      "nbytes": a.nbytes, "name": leaf, "crc32": _crc(a)})
        offsets.append(pos)
        pos += a.nbytes
    header = json.dumps({"tree": tree, "arrays": table, "crc32": _header_crc(tree, table)},
                        separators=(",", ":")).encode()
    return header, offsets


def _write(f: BinaryIO, tree: Any, arrays: List[Tuple[str, np.ndarray]]) -> None:
    header, offsets = _header(tree, arrays)
    f.write(MAGIC + struct.pack("<Q", len(header)) + header)
    start = f.tell()
    for (_, a), off in zip(arrays, offsets):
        f.write(b"\0" * (start + off - f.tell()))
        f.write(a.reshape(-1).view(np.uint8).tobytes())


def save(obj: Any, path: str) -> None:
    """Write ``obj`` (nested dicts/lists of Tensors, arrays and scalars) to ``path`` atomically."""
    arrays: List[Tuple[str, np.ndarray]] = []
    tree = _encode(obj, arrays, "obj")
    write_atomic(_path(path, "ndl.save"), lambda f: _write(f, tree, arrays))


def _path(path: Any, who: str) -> str:
    """``path`` as a str, refusing a NUL byte (the OS's 'embedded null byte' names no file)."""
    path = os.fspath(path)
    if isinstance(path, str) and "\0" in path:
        raise ValueError(f"{who}: the path {path!r} holds a NUL byte")
    return path


# ---------------------------------------------------------------------------- decoding
# Every way a crafted header can make Python itself fail, turned into a CheckpointError.
_MALFORMED = (OverflowError, ValueError, KeyError, IndexError, TypeError, AttributeError,
              struct.error, RecursionError, UnicodeError)
_MAX_NDIM = 64


class _ArrayRow(NamedTuple):
    """One checked row of the array table: where its bytes lie and what they must be."""
    dtype: np.dtype
    shape: Tuple[int, ...]
    lo: int
    nbytes: int
    crc: Optional[int]
    name: str


def _fail(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"ndl.load: {path} is not a valid needle checkpoint: {why}")


def _read_header(f: BinaryIO, size: int, path: str) -> Tuple[Dict[str, Any], int]:
    raw = f.read(16)
    if raw[:len(MAGIC)] != MAGIC:
        if raw.startswith(_PICKLE_PREFIXES):
            raise _fail(path, "it looks like a pickle; pickles can run code on load and are "
                              "refused")
        if raw.startswith(b"PK\x03\x04"):
            raise _fail(path, "it is a zip/npz archive; only files written by ndl.save load")
        raise _fail(path, f"bad magic {raw[:8]!r} (expected {MAGIC!r})")
    if len(raw) < 16:
        raise _fail(path, "truncated header")
    (hlen,) = struct.unpack("<Q", raw[8:16])
    if 16 + hlen > size:
        raise _fail(path, f"header length {hlen} exceeds the file size {size}")
    try:
        header = json.loads(f.read(hlen).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(path, f"corrupt JSON header ({type(e).__name__})") from None
    if not isinstance(header, dict) or "tree" not in header or "arrays" not in header:
        raise _fail(path, "header lacks 'tree'/'arrays'")
    return header, 16 + hlen


def _check_header_crc(header: Dict[str, Any], path: str, verify: bool) -> None:
    """The header's own checksum; a file without one loads only unverified."""
    if "crc32" not in header:
        if verify:
            raise _fail(path, "it has no checksums (written by an older needle, or its header "
                              "was edited), so corruption in it cannot be detected; pass "
                              "verify=False to load it anyway")
        return
    if header["crc32"] != _header_crc(header["tree"], header["arrays"]):
        raise CheckpointError(f"ndl.load: {path}: the header's checksum does not match (the "
                              "file is corrupt)")


def _int(v: Any) -> int:
    """A JSON integer (not a bool, float or string), else TypeError."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _check_entry(i: int, e: Any, start: int, verify: bool, path: str) -> _ArrayRow:
    """Row ``i`` of the array table, its dtype, shape and byte range checked."""
    if not isinstance(e, dict):
        raise _fail(path, f"array {i} has a malformed entry {str(e)[:80]}")
    if e.get("dtype") not in _DTYPES:
        raise _fail(path, f"array {i} has disallowed dtype {str(e.get('dtype'))[:40]!r}")
    if not isinstance(e.get("shape"), list) or len(e["shape"]) > _MAX_NDIM:
        raise _fail(path, f"array {i} has a malformed shape {str(e.get('shape'))[:80]}")
    shape = tuple(_int(s) for s in e["shape"])
    offset, nbytes = _int(e.get("offset")), _int(e.get("nbytes"))
    name = e["dtype"]
    dtype = to_numpy_dtype(name) if name == "bfloat16" else np.dtype(name)
    dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    if any(s < 0 for s in shape) or math.prod(shape) * dtype.itemsize != nbytes:
        raise _fail(path, f"array {i}: shape {list(shape)} x {name} != {nbytes} bytes")
    if offset < 0:
        raise _fail(path, f"array {i} has a negative offset {offset}")
    crc = e.get("crc32")
    if crc is None and verify:
        raise _fail(path, f"array {i} has no checksum; pass verify=False to load it anyway")
    return _ArrayRow(dtype, shape, start + offset, nbytes, None if crc is None else _int(crc),
                  str(e.get("name", "?"))[:200])


def _check_table(table: Any, start: int, size: int, verify: bool, path: str) -> List[_ArrayRow]:
    """The array table; its regions lie inside the file, in order, without overlapping, so the
    arrays together never ask for more memory than the file's size."""
    if not isinstance(table, list):
        raise _fail(path, "array table is not a list")
    rows, end = [], start
    for i, e in enumerate(table):
        row = _check_entry(i, e, start, verify, path)
        if row.lo < end:
            raise _fail(path, f"array {i} overlaps the bytes of array {i - 1} (each array's "
                              "bytes are stored once)")
        end = row.lo + row.nbytes
        if end > size:
            raise _fail(path, f"array {i} runs past the end of the file (truncated?)")
        rows.append(row)
    return rows


class _Arrays:
    """Reads each array of the table once, when the tree first references it, straight into
    its own buffer: a load holds about the file's size, not the file plus a copy."""

    def __init__(self, f: io.BufferedIOBase, rows: List[_ArrayRow], path: str) -> None:
        self.f, self.rows, self.path = f, rows, path
        self.used = [False] * len(rows)

    def take(self, i: Any) -> np.ndarray:
        """Array ``i`` read and checked; a second reference to it is refused."""
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.rows):
            raise _fail(self.path, f"array reference {str(i)[:40]} out of range")
        if self.used[i]:
            raise _fail(self.path, f"array {i} is referenced twice (each array is stored "
                                   "for one leaf)")
        self.used[i] = True
        row = self.rows[i]
        arr = np.empty(row.nbytes // row.dtype.itemsize, dtype=row.dtype)
        self.f.seek(row.lo)
        if self.f.readinto(arr.view(np.uint8).data) != row.nbytes:
            raise _fail(self.path, f"array {i}: the file ended while reading it (was it "
                                   "changed during the load?)")
        if row.crc is not None and _crc(arr) != row.crc:
            raise CheckpointError(f"ndl.load: {self.path}: array {i} ({row.name}, "
                                  f"{row.dtype.name}{list(row.shape)}) does not match its "
                                  "checksum (the file is corrupt)")
        return arr.astype(row.dtype.newbyteorder("="), copy=False).reshape(row.shape)

    def check_all_used(self) -> None:
        """Every array of the table belongs to a leaf (an unreferenced one was never checked)."""
        if not all(self.used):
            raise _fail(self.path, f"array {self.used.index(False)} is in the table but not in "
                                   "the tree")


def _decode(node: Any, arrays: _Arrays, device: Optional[BackendDevice], path: str) -> Any:
    if not isinstance(node, dict) or "t" not in node or "v" not in node:
        raise _fail(path, f"malformed node {str(node)[:80]}")
    t, v = node["t"], node["v"]
    if t in ("const", "int", "float", "bytes"):
        return _decode_scalar(t, v, path)
    if t == "dict":
        pairs = [_pair(x, path) for x in _items(v, path)]
        return {k: _decode(x, arrays, device, path) for k, x in pairs}
    if t in ("list", "tuple"):
        items = [_decode(x, arrays, device, path) for x in _items(v, path)]
        return items if t == "list" else tuple(items)
    if t in ("tensor", "ndarray", "numpy", "npscalar"):
        return _decode_leaf(node, arrays, device, path)
    raise _fail(path, f"unknown node type {str(t)[:40]!r}")


def _items(v: Any, path: str) -> List[Any]:
    if not isinstance(v, list):
        raise _fail(path, f"a container node holds {type(v).__name__}, not a list")
    return v


def _pair(x: Any, path: str) -> List[Any]:
    """A dict item: [key, node], the key a str or int as ``save`` writes them."""
    if not isinstance(x, list) or len(x) != 2:
        raise _fail(path, f"a dict item is {str(x)[:80]}, not a [key, value] pair")
    if not isinstance(x[0], (str, int)) or isinstance(x[0], bool):
        raise _fail(path, f"a dict key is {str(x[0])[:80]}, not a str or int")
    return x


def _decode_scalar(t: str, v: Any, path: str) -> Any:
    """The value of a const/int/float/bytes node, its JSON type checked."""
    if t == "const" and (v is None or isinstance(v, (bool, str))):
        return v
    if t == "int" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if t == "float" and isinstance(v, str):
        return float.fromhex(v)
    if t == "bytes" and isinstance(v, str):
        return bytes.fromhex(v)
    raise _fail(path, f"malformed {t} node {v!r:.80}")


def _decode_leaf(node: Dict, arrays: _Arrays, device: Optional[BackendDevice],
                 path: str) -> Any:
    """A Tensor, NDArray, NumPy array or scalar from the array table."""
    t = node["t"]
    arr = arrays.take(node["v"])
    if t == "numpy":
        return arr
    if t == "npscalar":
        if arr.shape != ():
            raise _fail(path, f"a NumPy scalar leaf holds an array of shape {arr.shape}")
        return arr[()]
    if t == "ndarray":
        return NDArray(arr, device=device, dtype=arr.dtype)
    # make_const wraps the new NDArray: Tensor(...) would copy it once more
    return Tensor.make_const(NDArray(arr, device=device, dtype=arr.dtype),
                             requires_grad=bool(node.get("requires_grad", False)))


def load(path: str, device: Optional[BackendDevice] = None, verify: bool = True) -> Any:
    """Read a checkpoint written by ``save``; Tensors/NDArrays land on ``device`` (default cpu).

    Every failure is a ``CheckpointError`` naming the file. A file without checksums is refused
    unless ``verify=False``."""
    if device is not None and not isinstance(device, BackendDevice):  # not the file's fault
        raise TypeError(f"ndl.load: device must be a needle BackendDevice (ndl.cpu(), "
                        f"ndl.cuda()), got {type(device).__name__} {device!r}")
    if not isinstance(verify, bool):  # verify="no" is truthy
        raise TypeError(f"ndl.load: verify must be True or False, got {verify!r}")
    path = _path(path, "ndl.load")
    if os.path.isdir(path):
        raise IsADirectoryError(f"ndl.load: {path} is a folder, not a checkpoint file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ndl.load: no checkpoint at {path}")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header, start = _read_header(f, size, path)
            _check_header_crc(header, path, verify)
            arrays = _Arrays(f, _check_table(header["arrays"], start, size, verify, path), path)
            obj = _decode(header["tree"], arrays, device, path)
            arrays.check_all_used()
            return obj
    except CheckpointError:
        raise
    except _MALFORMED as e:
        raise _fail(path, f"{type(e).__name__}: {str(e)[:200]}") from None

# ---------------------------------------------------------------------------- RNG state
def random_state() -> Dict[str, Any]:
    """NumPy's global RNG state (used by ``ndl.init`` and ``Dropout``), as a saveable dict."""
    state = np.random.get_state(legacy=False)
    return {"bit_generator": state["bit_generator"], "key": state["state"]["key"].copy(),
            "pos": int(state["state"]["pos"]), "has_gauss": int(state["has_gauss"]),
            "gauss": float(state["gauss"])}


def set_random_state(state: Dict[str, Any]) -> None:
    """Restore a state captured by ``random_state()``."""
    np.random.set_state({"bit_generator": state["bit_generator"],
                         "state": {"key": np.asarray(state["key"], dtype=np.uint32),
                                   "pos": int(state["pos"])},
                         "has_gauss": int(state["has_gauss"]), "gauss": float(state["gauss"])})
