"""Which host each rank runs on (every rank's host name, by one exchange), and the words
timeout messages add when ranks span hosts."""
import socket
import zlib
from typing import Any, Hashable, List, Optional, Sequence

import numpy as np

NAME_BYTES = 64  # host names longer than this are cut, with a checksum of the whole name


def _encoded_name() -> np.ndarray:
    """This host's name as ``NAME_BYTES // 8`` int64 (for exchanging over int64 messages)."""
    name = socket.gethostname().encode()
    if len(name) > NAME_BYTES:
        name = name[:NAME_BYTES - 9] + b"~" + b"%08x" % zlib.crc32(name)
    return np.frombuffer(name.ljust(NAME_BYTES, b"\0"), dtype=np.int64).copy()


def discover(exchange: Any, size: int) -> List[str]:
    """Every rank's host name, by an allgather (``exchange``: int64 array -> all ranks')."""
    words = exchange(_encoded_name())[:size * NAME_BYTES // 8].reshape(size, -1)
    return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in words]


def where(ranks: Sequence[int], nodes: Optional[Sequence[Hashable]]) -> str:
    """`` (rank 2 on host h1, ...)`` for error messages; empty when the hosts are unknown or
    all ranks share one."""
    if not nodes or len(set(nodes)) < 2:
        return ""
    return " (" + ", ".join(f"rank {q} on host {nodes[q]}" for q in ranks) + ")"
