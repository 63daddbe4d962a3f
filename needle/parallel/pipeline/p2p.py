"""Point-to-point messages between neighbouring pipeline stages.

TEMPORARY ADAPTER: the communicator has no ``send``/``recv`` yet (the communicator issue adds
them). Until then a message from stage a to stage b is a ``broadcast`` rooted at a on a
two-rank communicator holding just {a, b}: first an 8-number header (dtype, ndim, shape), then
the data. Such a message completes only when both stages reach it, like a synchronous send, so
the executor orders every rank's messages by one global key (``PipelineParallel._plan``), which
makes any schedule deadlock-free. Replace the two methods with ``comm.send``/``comm.recv`` when
they land; nothing else changes.
"""
from typing import Any, Dict, Tuple

import numpy as np

__all__ = ["Links"]

_DTYPES = ["float32", "float64", "float16", "int64", "int32"]
_HEADER = 8


class Links:
    """Two-rank communicators for the links (s, s+1) of a ring of p stages, and messages."""

    def __init__(self, comm: Any) -> None:
        self.comm, p, s = comm, comm.size, comm.rank
        self._pairs: Dict[Tuple[int, int], Any] = {}
        if p == 1:
            return
        # three collective splits, in the same order on every rank: links (2k, 2k+1),
        # (2k+1, 2k+2), and the wrap-around (p-1, 0) used by the interleaved schedule
        even = comm.split(color=s // 2, key=s)
        odd = comm.split(color=(s + 1) // 2, key=s)
        for a in range(p - 1):
            if s in (a, a + 1):
                self._pairs[(a, a + 1)] = even if a % 2 == 0 else odd
        if p > 2:
            wrap = comm.split(color=0 if s in (0, p - 1) else 1 + s, key=(s + 1) % p)
            if s in (0, p - 1):
                self._pairs[(p - 1, 0)] = wrap
        else:
            self._pairs[(1, 0)] = self._pairs[(0, 1)]

    def _pair(self, peer: int) -> Any:
        """The two-rank communicator of this stage and ``peer``."""
        me = self.comm.rank
        pair = self._pairs.get((me, peer)) or self._pairs.get((peer, me))
        if pair is None:
            raise ValueError(f"stages {me} and {peer} are not neighbours in a ring of "
                             f"{self.comm.size}")
        return pair

    def send(self, x: np.ndarray, dst: int) -> None:
        """Deliver ``x`` to stage ``dst`` (returns once ``dst`` has it)."""
        pair = self._pair(dst)
        root = pair.rank
        x = np.ascontiguousarray(x)
        header = np.zeros(_HEADER, dtype=np.int64)
        header[0], header[1] = _DTYPES.index(x.dtype.name), x.ndim
        header[2:2 + x.ndim] = x.shape
        pair.broadcast(header, root=root)
        pair.broadcast(x, root=root)

    def recv(self, src: int) -> np.ndarray:
        """The next array stage ``src`` sends here."""
        pair = self._pair(src)
        root = 1 - pair.rank
        header = pair.broadcast(np.zeros(_HEADER, dtype=np.int64), root=root)
        shape = tuple(int(n) for n in header[2:2 + int(header[1])])
        return pair.broadcast(np.empty(shape, dtype=_DTYPES[int(header[0])]), root=root)
