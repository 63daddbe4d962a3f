"""Gradient buckets: many small gradients packed into a few flat buffers, one collective each.

Li et al., "PyTorch Distributed" (VLDB 2020), sec. 3.2: each call pays a latency ``alpha``, so a
few large buckets beat one call per tensor; gradients arrive in roughly reverse registration
order, so buckets fill in that order and each is reduced while backward goes on. Collectives
launch strictly in bucket order (every rank must issue them in the same order).

A bucket is ``rows`` rows (1 for DDP's allreduce, N for ZeRO-2's reduce-scatter), each ``cols``
data elements followed by one *usage flag* per parameter (1 where this rank produced that
gradient): after the reduction every rank knows, at no extra call, which parameters no rank used
(they keep ``grad = None``, as in single-process training).
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...autograd import Tensor
from ...backend_ndarray.dtypes import to_numpy_dtype
from ...process_state import switches
from ..comm.engine.convert import empty_host, host_view
from ..comm.protocol import Comm
from .flat_layout import FlatLayout

__all__ = ["assign_buckets", "reduce_dtype", "Bucket", "BucketReducer", "reduce_scatter_bucket"]

_DONE = object()  # a bucket's ``work`` once ``on_done`` has consumed its result
MB = 1024 * 1024  # the unit of the bucket caps users give


def reduce_dtype(dtype: str) -> str:
    """The dtype gradients are summed in: 16-bit floats are summed in float32."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def assign_buckets(sizes_bytes: Sequence[int], dtypes: Sequence[str], cap_bytes: float,
                   first_cap_bytes: Optional[float] = None) -> List[List[int]]:
    """Group tensor indices into buckets per dtype, last tensor first, each filled to at least the
    cap (the first to ``first_cap_bytes``): PyTorch's ``_compute_bucket_assignment_by_size``."""
    if cap_bytes <= 0 or (first_cap_bytes is not None and first_cap_bytes <= 0):
        raise ValueError(f"bucket caps must be > 0 bytes, got cap={cap_bytes}, "
                         f"first={first_cap_bytes}")
    first = cap_bytes if first_cap_bytes is None else first_cap_bytes
    open_: Dict[str, Tuple[List[int], int, float]] = {}  # dtype -> (indices, bytes, its cap)
    done: List[List[int]] = []
    for i in reversed(range(len(sizes_bytes))):
        idx, nbytes, cap = open_.get(dtypes[i], ([], 0, first))
        idx.append(i)
        nbytes += int(sizes_bytes[i])
        if nbytes >= cap:
            done.append(idx)
            open_[dtypes[i]] = ([], 0, cap_bytes)
        else:
            open_[dtypes[i]] = (idx, nbytes, cap)
    done.extend(idx for idx, _, _ in open_.values() if idx)
    # Launch order: the bucket whose first tensor comes latest in registration order first.
    return sorted(done, key=lambda b: -b[0])


class Bucket(FlatLayout):
    """One flat buffer holding the gradients of ``params`` (see the module docstring)."""

    def __init__(self, params: Sequence[Tensor], rows: int, dtype: Any) -> None:
        self.params = list(params)
        # cols: data elements per row (the last row padded)
        super().__init__([tuple(p.shape) for p in self.params], rows)
        self.rows = rows
        self.dtype = dtype
        self._storage: Any = None
        self.buffer: Any = None  # (rows, cols + flags), allocated when the first grad arrives
        self.have = np.zeros(len(self.params), dtype=bool)  # local gradient written, per slot
        self.pending = len(self.params)  # slots still waiting for this backward's gradient
        self.work: Any = None
        self.received: Any = None  # reduce_scatter_bucket's received row's storage

    def allocate(self) -> np.ndarray:
        """The buffer, allocated (zeroed) if it was not there."""
        if self.buffer is None:
            width = self.cols + len(self.params)
            self._storage, flat = empty_host(self.rows * width, self.dtype)
            self.buffer = flat.reshape(self.rows, width)
            self.buffer[...] = 0
        return self.buffer

    def release(self) -> None:
        """Free the buffer (ZeRO-2 keeps no full gradient between steps)."""
        self._storage = self.buffer = None

    def spans(self, slot: int) -> List[Tuple[int, int, int, int]]:
        """(row, first column, count, offset in the gradient) of each row a slot spans."""
        out, done, start, n = [], 0, self.offsets[slot], self.sizes[slot]
        while done < n:
            row, col = divmod(start + done, self.cols)
            take = min(self.cols - col, n - done)
            out.append((row, col, take, done))
            done += take
        return out

    def write(self, slot: int, grad: np.ndarray, accumulate: bool) -> None:
        """Copy (or, accumulating onto a gradient already here, add) one gradient."""
        flat = grad.reshape(-1)
        self.allocate()
        add = accumulate and self.have[slot]
        for row, col, take, done in self.spans(slot):
            dst = self.buffer[row, col:col + take]
            if add:
                dst += flat[done:done + take]
            else:
                dst[...] = flat[done:done + take]
        self.have[slot] = True

    def read(self, slot: int, rows: np.ndarray) -> np.ndarray:
        """A slot's gradient out of reduced ``rows`` (a view when it lies in one row)."""
        parts = [rows[row, col:col + take] for row, col, take, _ in self.spans(slot)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def seal(self) -> None:
        """Before launching: zero the slots this rank has no gradient for; write the flags."""
        self.allocate()
        for slot in np.flatnonzero(~self.have):
            for row, col, take, _ in self.spans(int(slot)):
                self.buffer[row, col:col + take] = 0
        self.buffer[:, self.cols:] = self.have

    def reset(self) -> None:
        """Ready for the next accumulation (``no_sync`` steps keep adding until a sync)."""
        self.have[:] = False
        self.pending = len(self.params)
        self.work = None


def reduce_scatter_bucket(comm: Comm, bucket: "Bucket") -> Any:
    """Start summing ``bucket.buffer`` over the ranks, row r to rank r; the Work. The received
    row's storage is ``bucket.received`` (keep it alive while the row is used)."""
    bucket.received, out = empty_host(bucket.buffer.shape[1], bucket.buffer.dtype)
    return comm.reduce_scatter_async(bucket.buffer, op="sum", out=out.reshape(1, -1))


class BucketReducer:
    """Fill buckets from gradient hooks and reduce each one as soon as it is complete.

    Buckets launch in index order only (as on every other rank). ``on_done(bucket, result)`` takes
    each result as soon as it is seen complete; ``finish`` returns the ones it waited for itself."""

    def __init__(self, params: Sequence[Tensor], layout: List[List[int]], rows: int,
                 launch: Callable[[Bucket], Any],
                 dtype_of: Callable[[str], str] = lambda dtype: dtype,
                 on_done: Optional[Callable[[Bucket, Any], None]] = None) -> None:
        self.buckets = [Bucket([params[i] for i in idx], rows,
                               to_numpy_dtype(dtype_of(params[idx[0]].dtype)))
                        for idx in layout]
        self.slot_of: Dict[int, Tuple[int, int]] = {
            id(p): (b, s) for b, bucket in enumerate(self.buckets)
            for s, p in enumerate(bucket.params)}
        self._launch, self._on_done = launch, on_done
        self.next_launch = 0

    def add(self, param: Tensor, accumulate: bool = False) -> Optional[Bucket]:
        """Put ``param.grad`` in its bucket; returns the bucket if this completed it."""
        b, s = self.slot_of[id(param)]
        bucket = self.buckets[b]
        if bucket.work is not None:
            raise RuntimeError(f"gradient of a parameter of shape {tuple(param.shape)} arrived "
                               "twice in one backward (after its bucket was launched)")
        bucket.write(s, host_view(param.grad), accumulate)
        bucket.pending -= 1
        return bucket if bucket.pending == 0 else None

    def launch_ready(self) -> None:
        """Launch every complete bucket whose predecessors have launched; poke the rest."""
        while self.next_launch < len(self.buckets) and \
                self.buckets[self.next_launch].pending <= 0:
            self._start(self.buckets[self.next_launch])
            self.next_launch += 1
        for bucket in self.buckets[:self.next_launch]:
            if bucket.work is None or bucket.work is _DONE:
                continue
            if bucket.work.test() and self._on_done is not None:
                self._on_done(bucket, bucket.work.wait())  # wait() of a finished call: result
                bucket.work = _DONE

    def _start(self, bucket: Bucket) -> None:
        if switches.profiler is not None:  # needle.profiler: mark the launch on the timeline
            nbytes = int(getattr(bucket.buffer, "nbytes", 0))
            switches.profiler.instant(f"bucket {self.buckets.index(bucket)} launched", "bucket",
                                      {"params": len(bucket.params), "bytes": nbytes})
        bucket.seal()
        bucket.work = self._launch(bucket)

    def finish(self) -> List[Any]:
        """Launch what is left (missing gradients count as zero), wait for all; the results."""
        for bucket in self.buckets[self.next_launch:]:
            self._start(bucket)
        results = []
        for bucket in self.buckets:
            if bucket.work is not _DONE:
                results.append(bucket.work.wait())
                if self._on_done is not None:
                    self._on_done(bucket, results[-1])
            bucket.reset()
        self.next_launch = 0
        return results

    def rearm(self) -> None:
        """Expect the next backward's gradients, keeping what the buckets hold (no_sync)."""
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)

    def reset(self) -> None:
        """Forget a half-finished backward (e.g. one that raised)."""
        for bucket in self.buckets:
            if bucket.work is not None and bucket.work is not _DONE:
                bucket.work.wait()
            bucket.reset()
        self.next_launch = 0
