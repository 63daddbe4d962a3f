"""The manifest of a sharded checkpoint: which files make it up, and the checksum of each.

A sharded save writes one file per rank, then the ranks allgather their files' CRC-32s and rank 0
writes the manifest (JSON) last, atomically (temporary file, fsync, rename).  A loader reads only
the files its manifest names and checks each one's checksum before using it, so

* a file left over from an earlier save with another layout (stage3 of a pp=4 save in a folder
  now holding a pp=2 save) is never read, and
* a file rewritten after the manifest (or a crash between two saves) is refused, not mixed in.

Every error names the file.
"""
import json
import os
import zlib
from typing import Any, BinaryIO, Dict, List

import numpy as np

from .. import serialization
from .comm.protocol import Comm

CHUNK = 1 << 22


def file_crc(path: str) -> int:
    """CRC-32 of a whole file."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            crc = zlib.crc32(block, crc)
    return crc


def write(comm: Comm, directory: str, name: str, mine: str, extra: List[int],
          meta: Dict[str, Any]) -> None:
    """Collective, after each rank wrote ``mine``: rank 0 writes ``name`` listing every rank's
    file, its checksum and its ``extra`` ints (in rank order), then every rank waits for it."""
    row = np.array([file_crc(os.path.join(directory, mine))] + list(extra), dtype=np.int64)
    rows = comm.allgather(row.reshape(1, -1))
    names = comm.allgather(np.frombuffer(mine.encode().ljust(128, b"\0"), np.uint8))
    if comm.rank == 0:
        files = [{"file": bytes(names[128 * r:128 * (r + 1)]).rstrip(b"\0").decode(),
                  "crc32": int(rows[r, 0]), "extra": [int(v) for v in rows[r, 1:]]}
                 for r in range(comm.size)]
        text = json.dumps(dict(meta, files=files), indent=1).encode()
        serialization.write_atomic(os.path.join(directory, name), lambda f: _write(f, text))
    comm.barrier()


def read(directory: str, name: str, who: str, keys: tuple = ()) -> Dict[str, Any]:
    """The manifest ``name`` in ``directory``: a clear error naming the file if it is missing,
    truncated, not JSON or lacks one of ``keys`` (``files`` always)."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{who}: no {name} in {directory!r} (not a complete checkpoint: "
                                "the manifest is written last)")
    try:
        with open(path) as f:
            index = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise serialization.CheckpointError(f"{who}: {path} is truncated or not JSON "
                                            f"({err})") from None
    need = ("files",) + tuple(keys)
    if not isinstance(index, dict) or any(k not in index for k in need):
        raise serialization.CheckpointError(f"{who}: {path} lacks one of {list(need)}")
    return index


def load(directory: str, entry: Dict[str, Any], who: str) -> Any:
    """``ndl.load`` of one file the manifest names, after checking its checksum."""
    path = os.path.join(directory, entry["file"])
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{who}: the manifest names {path}, which is missing")
    if file_crc(path) != entry["crc32"]:
        raise serialization.CheckpointError(
            f"{who}: {path} does not match the checksum in its manifest (rewritten or "
            "corrupted after the checkpoint was saved; not mixing it in)")
    return serialization.load(path)


def _write(f: BinaryIO, data: bytes) -> None:
    f.write(data)
