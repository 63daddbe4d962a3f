"""Memory for large collective results, reused once the caller has dropped them.

A fresh 64 MiB result comes straight from ``mmap``, and the kernel faults in and zeroes each
page on the collective's first write: the plain call was clearly slower than one with ``out=``
(benchmarks/README.md, "Figures behind constants and docstrings"). The pool keeps the last few
large buffers and hands one out again only when nothing but the pool refers to it (every view
of a result keeps its buffer alive). Results under ``MIN_BYTES`` come from ``np.empty``.
"""
import math
import sys
from typing import List

import numpy as np

MIN_BYTES = 1 << 20
KEEP = 4  # buffers kept at most (the memory of KEEP dropped results stays mapped)
_FREE_REFS = 3  # the pool's list, the loop variable and getrefcount's argument


class ResultPool:
    """Large result buffers, reused when their last result has been dropped."""

    def __init__(self, keep: int = KEEP, min_bytes: int = MIN_BYTES) -> None:
        self.keep, self.min_bytes = keep, min_bytes
        self._bufs: List[np.ndarray] = []

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Like ``np.empty(shape, dtype)``: uninitialised, owned by the caller from now on."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize  # (np.prod costs ~1 us a call)
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dtype)
        free = None
        for buf in self._bufs:
            if sys.getrefcount(buf) == _FREE_REFS:
                if buf.nbytes == nbytes:
                    return buf.view(dtype).reshape(shape)
                free = buf if free is None else free
        buf = np.empty(nbytes, dtype=np.uint8)
        if len(self._bufs) >= self.keep:
            if free is None:
                return buf.view(dtype).reshape(shape)  # all kept buffers in use: don't track
            self._bufs = [b for b in self._bufs if b is not free]
        self._bufs.append(buf)
        return buf.view(dtype).reshape(shape)
