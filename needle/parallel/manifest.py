"""The manifest of a sharded checkpoint: which files make it up, and the checksum of each,
written last by rank 0 (docs/reliability.md, "Checkpoints"). Errors are ``CheckpointError``
naming the file.
"""
import json
import os
import zlib
from typing import Any, BinaryIO, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import serialization
from .comm.protocol import Comm

CHUNK = 1 << 22
VERSION = 2
AXES = ("tp", "pp", "dp")
CheckpointError = serialization.CheckpointError


class Kind(NamedTuple):
    """What one sharded format's manifest holds (declared once, beside its saver)."""
    format: str  # the "format" field
    axis: str  # the layout axis the saving ranks span: "tp", "pp" or "dp"
    size_key: str  # the field that also holds that size ("tp", "stages", "world_size")
    file_name: Callable[[int, int], str]  # the file rank r of n writes
    n_extra: int = 0  # ints each entry carries (a stage's layer range)
    keys: Tuple[str, ...] = ()  # further fields the loader needs


def file_crc(path: str) -> int:
    """CRC-32 of a whole file."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _crc(index: Dict[str, Any]) -> int:
    """CRC-32 of the manifest without its own checksum, as canonical JSON."""
    body = {k: v for k, v in index.items() if k != "crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write(comm: Comm, directory: str, name: str, kind: Kind, extra: List[int],
          meta: Dict[str, Any]) -> None:
    """Collective, after each rank wrote ``kind.file_name(rank, size)``: rank 0 writes ``name``
    listing every rank's file, layout, checksum and ``extra`` ints (in rank order), then every
    rank waits for it."""
    mine = kind.file_name(comm.rank, comm.size)
    layout = [comm.size if a == kind.axis else 1 for a in AXES]
    row = np.array([file_crc(os.path.join(directory, mine))] + layout + list(extra),
                   dtype=np.int64)
    rows = comm.allgather(row.reshape(1, -1))
    names = comm.allgather(np.frombuffer(mine.encode().ljust(128, b"\0"), np.uint8))
    if comm.rank == 0:
        files = [{"rank": r, "file": bytes(names[128 * r:128 * (r + 1)]).rstrip(b"\0").decode(),
                  "crc32": int(rows[r, 0]), "layout": dict(zip(AXES, map(int, rows[r, 1:4]))),
                  "extra": [int(v) for v in rows[r, 4:]]} for r in range(comm.size)]
        index = dict(meta, format=kind.format, manifest=VERSION, layout=dict(zip(AXES, layout)),
                     files=files)
        index[kind.size_key] = comm.size
        index["crc32"] = _crc(index)
        text = json.dumps(index, indent=1).encode()
        serialization.write_atomic(os.path.join(directory, name), lambda f: _write(f, text))
    comm.barrier()


def read(directory: str, name: str, kind: Kind, who: str,
         expect: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """The manifest ``name`` in ``directory``, every field checked; ``expect`` gives the layout
    sizes the loader needs (an axis it can reshard along is left out)."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{who}: no {name} in {directory!r} (not a complete checkpoint: "
                                "the manifest is written last)")
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"{who}: {path} is truncated or not JSON ({err})") from None
    fail = failer(who, path)
    need = ("files", "crc32", "layout", kind.size_key) + kind.keys
    if not isinstance(index, dict) or any(k not in index for k in need):
        if isinstance(index, dict) and "files" in index and "crc32" not in index:
            raise fail("written by an older needle: it has no checksum of its own and its "
                       "entries name no rank, so a swapped entry cannot be told; re-save it")
        raise fail(f"lacks one of {list(need)}")
    if index["crc32"] != _crc(index):
        raise fail("its own checksum does not match (the manifest is corrupt)")
    if index.get("manifest") != VERSION or index.get("format") != kind.format:
        raise fail(f"format {str(index.get('format'))[:40]!r} version "
                   f"{str(index.get('manifest'))[:10]}; this loader reads {kind.format!r} "
                   f"version {VERSION}")
    layout = _check_layout(index, kind, expect or {}, fail)
    _check_files(index["files"], layout, kind, directory, fail)
    return index


def failer(who: str, path: str) -> Callable[[str], CheckpointError]:
    """A function making a CheckpointError that names ``who`` and the manifest ``path``."""
    return lambda why: CheckpointError(f"{who}: {path}: {why}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_layout(index: Dict[str, Any], kind: Kind, expect: Dict[str, int],
                  fail: Callable[[str], CheckpointError]) -> Dict[str, int]:
    """The manifest's layout: positive sizes, one per axis, agreeing with its size field, its
    number of entries and the loader's ``expect``."""
    layout = index["layout"]
    if not isinstance(layout, dict) or sorted(layout) != sorted(AXES) or not all(
            _is_int(v) and v >= 1 for v in layout.values()):
        raise fail(f"malformed layout {str(layout)[:80]} (want positive tp, pp, dp sizes)")
    size = layout[kind.axis]
    if index[kind.size_key] != size:
        raise fail(f"its {kind.size_key!r} field says {str(index[kind.size_key])[:20]} but its "
                   f"layout says {kind.axis}={size}")
    if any(layout[a] != 1 for a in AXES if a != kind.axis):
        raise fail(f"layout {layout}: a {kind.format} checkpoint spans {kind.axis} only")
    for axis, want in expect.items():
        if layout[axis] != want:
            raise fail(f"saved at {axis}={layout[axis]}, this loader runs at {axis}={want}")
    files = index["files"]
    if not isinstance(files, list) or len(files) != size:
        raise fail(f"{kind.axis}={size} but {len(files) if isinstance(files, list) else 'no'} "
                   "entries in 'files'")
    return layout


def _check_files(files: List[Any], layout: Dict[str, int], kind: Kind, directory: str,
                 fail: Callable[[str], CheckpointError]) -> None:
    """Entry ``r`` names rank ``r``, the layout, rank ``r``'s own file (inside ``directory``),
    an integer checksum and ``kind.n_extra`` ints."""
    n = len(files)
    for r, e in enumerate(files):
        if not isinstance(e, dict):
            raise fail(f"entry {r} is {str(e)[:80]}, not an object")
        if e.get("rank") != r:
            raise fail(f"entry {r} names rank {str(e.get('rank'))[:20]}")
        if e.get("layout") != layout:
            raise fail(f"entry {r} names layout {str(e.get('layout'))[:80]}, the manifest {layout}")
        want = kind.file_name(r, n)
        if e.get("file") != want:
            raise fail(f"entry {r} names file {str(e.get('file'))[:80]!r}; rank {r} of {n} "
                       f"writes {want!r}")
        if not _is_int(e.get("crc32")):
            raise fail(f"entry {r} has checksum {str(e.get('crc32'))[:20]}")
        extra = e.get("extra")
        if not isinstance(extra, list) or len(extra) != kind.n_extra or not all(
                _is_int(v) for v in extra):
            raise fail(f"entry {r} has extra {str(extra)[:80]}, want {kind.n_extra} ints")
        inside(directory, want, fail)


def inside(directory: str, name: str, fail: Callable[[str], CheckpointError]) -> str:
    """``directory/name``, refused unless it is a plain name that stays in ``directory``."""
    if os.path.isabs(name) or "/" in name or "\\" in name or name in ("", ".", "..") \
            or "\0" in name:
        raise fail(f"file {name!r} is not a plain name inside the checkpoint's folder")
    path = os.path.join(directory, name)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise fail(f"{path} leads out of the checkpoint's folder (a symlink?)")
    return path


def load(directory: str, entry: Dict[str, Any], who: str) -> Any:
    """``ndl.load`` of one file a checked manifest names, after checking its checksum."""
    path = inside(directory, entry["file"], lambda why: CheckpointError(f"{who}: {why}"))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{who}: the manifest names {path}, which is missing")
    if file_crc(path) != entry["crc32"]:
        raise CheckpointError(
            f"{who}: {path} does not match the checksum in its manifest (rewritten or "
            "corrupted after the checkpoint was saved; not mixing it in)")
    return serialization.load(path)


def _write(f: BinaryIO, data: bytes) -> None:
    f.write(data)
