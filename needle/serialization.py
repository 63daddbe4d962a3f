"""Checkpoints: ``ndl.save(obj, path)`` / ``ndl.load(path)`` without pickle, written atomically.

File layout (safetensors-style, https://github.com/huggingface/safetensors):

    8 bytes   magic  b"NDLCKPT1"
    8 bytes   little-endian uint64 length H of the header
    H bytes   UTF-8 JSON header: {"tree": <structure>, "arrays": [{dtype, shape, offset, nbytes}]}
    ...       the raw little-endian bytes of every array, in header order

Every array's entry carries the CRC-32 of its bytes and the path of its leaf ("obj['w']"), and
the header carries the CRC-32 of its own tree and table ("crc32"), so a flipped byte anywhere in
the file is refused on load, naming the file and the array.

The structure is a JSON tree of dicts/lists/tuples/scalars whose array leaves point into the
array table, so loading only parses JSON and copies bytes: nothing in the file can run code.
Arrays keep their exact dtype (bfloat16 included, by name). Floats are stored as ``float.hex``
so they round-trip exactly. A save writes a temporary file in the target directory, fsyncs it
and renames it over the target (``os.replace`` is atomic on POSIX), so a crash mid-save leaves
the previous checkpoint intact.
"""
import json
import os
import struct
import tempfile
import zlib
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

import numpy as np

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


def _encode(obj: Any, arrays: List[Tuple[str, np.ndarray]], path: str) -> Any:
    """The JSON node for ``obj``; array leaves are appended to ``arrays``."""
    if obj is None:
        return {"t": "const", "v": None}
    for cls, kind in _SCALARS:
        if isinstance(obj, cls):
            return _encode_scalar(obj, kind)
    for cls, kind in _ARRAY_KINDS:
        if isinstance(obj, cls):
            return _encode_leaf(obj, kind, arrays, path)
    if isinstance(obj, dict):
        return {"t": "dict", "v": [[_key(k, path), _encode(v, arrays, f"{path}[{k!r}]")]
                                   for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {"t": kind, "v": [_encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(obj)]}
    raise TypeError(f"ndl.save: cannot store {type(obj).__name__} at {path}; checkpoints hold "
                    "dicts/lists/tuples of Tensors, NDArrays, numpy arrays, numbers, str, None")


def _encode_scalar(obj: Any, kind: str) -> Dict:
    """A bool/str/int (stored as is) or a float/bytes (stored as exact hex)."""
    return {"t": kind, "v": obj.hex() if kind in ("float", "bytes") else obj}


def _encode_leaf(obj: Any, kind: str, arrays: List[Tuple[str, np.ndarray]], path: str) -> Dict:
    """A Tensor, NDArray, NumPy array or NumPy scalar, as an entry of the array table."""
    if kind == "tensor":
        return _encode_array(obj.numpy(), arrays, kind, path, requires_grad=obj.requires_grad)
    arr = obj.numpy() if kind == "ndarray" else np.asarray(obj)
    return _encode_array(arr, arrays, kind, path)


def _key(k: Any, path: str) -> Any:
    """A dict key, which must be str or int (JSON keeps those exactly)."""
    if not isinstance(k, (str, int)) or isinstance(k, bool):
        raise TypeError(f"ndl.save: dict keys must be str or int, got {k!r} at {path}")
    return k


def _encode_array(arr: np.ndarray, arrays: List[Tuple[str, np.ndarray]], kind: str,
                  path: str = "obj", **extra: Any) -> Dict:
    name = arr.dtype.name
    if name not in _DTYPES:
        raise TypeError(f"ndl.save: unsupported array dtype {name!r}; supported: {_DTYPES}")
    little = arr if arr.dtype.byteorder != ">" else arr.astype(arr.dtype.newbyteorder("<"))
    arrays.append((path, little if little.flags.c_contiguous else little.copy(order="C")))
    return {"t": kind, "v": len(arrays) - 1, **extra}


def _crc(a: np.ndarray) -> int:
    """CRC-32 of a C-contiguous array's bytes."""
    return zlib.crc32(a.reshape(-1).view(np.uint8))


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
    write_atomic(os.fspath(path), lambda f: _write(f, tree, arrays))


def write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write`` on a temporary file beside ``path``, then rename it over ``path``: readers
    see the old file or the whole new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------------- decoding
def _fail(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"ndl.load: {path} is not a valid needle checkpoint: {why}")


def _read_header(raw: bytes, path: str) -> Tuple[Dict[str, Any], int]:
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
    if 16 + hlen > len(raw):
        raise _fail(path, f"header length {hlen} exceeds the file size {len(raw)}")
    try:
        header = json.loads(raw[16:16 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _fail(path, f"corrupt JSON header ({type(e).__name__})") from None
    if not isinstance(header, dict) or "tree" not in header or "arrays" not in header:
        raise _fail(path, "header lacks 'tree'/'arrays'")
    _check_header_crc(header, path)
    return header, 16 + hlen


def _check_header_crc(header: Dict[str, Any], path: str) -> None:
    """The header's own checksum; files written before checksums existed have none at all."""
    table = header["arrays"]
    new = "crc32" in header or (isinstance(table, list) and any(
        isinstance(e, dict) and ("crc32" in e or "name" in e) for e in table))
    if not new:
        return
    if header.get("crc32") != _header_crc(header["tree"], table):
        raise CheckpointError(f"ndl.load: {path}: the header's checksum does not match (the "
                              "file is corrupt)")


def _read_arrays(raw: bytes, table: Any, start: int, path: str) -> List[np.ndarray]:
    if not isinstance(table, list):
        raise _fail(path, "array table is not a list")
    out = []
    for i, entry in enumerate(table):
        try:
            dtype_name, shape = entry["dtype"], tuple(int(s) for s in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (TypeError, KeyError, ValueError):
            raise _fail(path, f"array {i} has a malformed entry {entry!r}") from None
        if dtype_name not in _DTYPES:
            raise _fail(path, f"array {i} has disallowed dtype {dtype_name!r}")
        dtype = to_numpy_dtype(dtype_name) if dtype_name == "bfloat16" else np.dtype(dtype_name)
        dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        if any(s < 0 for s in shape) or int(np.prod(shape)) * dtype.itemsize != nbytes:
            raise _fail(path, f"array {i}: shape {shape} x {dtype_name} != {nbytes} bytes")
        lo = start + offset
        if offset < 0 or lo + nbytes > len(raw):
            raise _fail(path, f"array {i} runs past the end of the file (truncated?)")
        arr = np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=lo)
        if "crc32" in entry and _crc(arr) != entry["crc32"]:
            raise CheckpointError(f"ndl.load: {path}: array {i} ({entry.get('name', '?')}, "
                                  f"{dtype_name}{list(shape)}) does not match its checksum "
                                  "(the file is corrupt)")
        out.append(arr.astype(dtype.newbyteorder("=")).reshape(shape))
    return out


def _decode(node: Any, arrays: List[np.ndarray], device: Optional[BackendDevice],
            path: str) -> Any:
    try:
        t, v = node["t"], node["v"]
    except (TypeError, KeyError):
        raise _fail(path, f"malformed node {str(node)[:80]}") from None
    if t in ("const", "int", "float", "bytes"):
        return _decode_scalar(t, v, path)
    if t == "dict":
        return {k: _decode(x, arrays, device, path) for k, x in v}
    if t in ("list", "tuple"):
        items = [_decode(x, arrays, device, path) for x in v]
        return items if t == "list" else tuple(items)
    if t in ("tensor", "ndarray", "numpy", "npscalar"):
        return _decode_leaf(node, arrays, device, path)
    raise _fail(path, f"unknown node type {t!r}")


def _decode_scalar(t: str, v: Any, path: str) -> Any:
    """The value of a const/int/float/bytes node, its JSON type checked."""
    if t == "const" and (v is None or isinstance(v, (bool, str))):
        return v
    if t == "int" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if t == "float":
        return float.fromhex(v)
    if t == "bytes":
        return bytes.fromhex(v)
    raise _fail(path, f"malformed {t} node {v!r:.80}")


def _decode_leaf(node: Dict, arrays: List[np.ndarray], device: Optional[BackendDevice],
                 path: str) -> Any:
    """A Tensor, NDArray, NumPy array or scalar from the array table."""
    t, v = node["t"], node["v"]
    if not isinstance(v, int) or not 0 <= v < len(arrays):
        raise _fail(path, f"array reference {v!r} out of range")
    arr = arrays[v]
    if t == "numpy":
        return arr
    if t == "npscalar":
        return arr[()]
    if t == "ndarray":
        return NDArray(arr, device=device, dtype=arr.dtype)
    return Tensor(NDArray(arr, device=device, dtype=arr.dtype),
                  requires_grad=bool(node.get("requires_grad", False)))


def load(path: str, device: Optional[BackendDevice] = None) -> Any:
    """Read a checkpoint written by ``save``; Tensors/NDArrays land on ``device`` (default cpu)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ndl.load: no checkpoint at {path}")
    with open(path, "rb") as f:
        raw = f.read()
    header, start = _read_header(raw, path)
    arrays = _read_arrays(raw, header["arrays"], start, path)
    try:
        return _decode(header["tree"], arrays, device, path)
    except (TypeError, ValueError, RecursionError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise _fail(path, f"{type(e).__name__}: {e}") from None


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
