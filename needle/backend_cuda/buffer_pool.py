"""needle's pool of freed device buffers, in front of CuPy's (PyTorch's caching allocator has the
same idea): when an ``Array`` dies its buffer waits here, keyed by (GPU, storage dtype, length),
and the next ``Array`` of that key takes it without a CuPy call. A training step frees and asks
for the same shapes every step, so from the second step on it allocates nothing; what CuPy's
``cupy.empty`` costs on the host (about 10 us a call on an H100's host) is gone.

Stream order keeps reuse safe, as in CuPy's pool: needle launches on one stream per GPU, so a
kernel that writes a reused buffer runs after every kernel that read it. A buffer whose memory
was handed out (a DLPack export) is never pooled. The pool is off under ``NEEDLE_CUDA_POOL=0``
and under the emulator's full memory check (whose uninitialised-read check needs fresh
buffers), and holds at most ``LIMIT_BYTES`` per GPU.
"""
import os
from typing import Any, Dict, List, Tuple

LIMIT_BYTES = 1 << 30
ON = os.environ.get("NEEDLE_CUDA_POOL", "1").strip() not in ("0", "off", "false", "no")
# the emulator's full memory check (read on each allocation: tests switch it per test)
FULL_CHECK = ("NEEDLE_CUDA_EMULATOR_CHECK", "full")
# The pool itself: (GPU, storage dtype, length) -> buffers, and the bytes they hold per GPU.
# ``ndarray_backend_cuda.Array`` takes from and gives to them inline (they run on every op).
FREE: Dict[Tuple[int, Any, int], List[Any]] = {}
HELD: Dict[int, int] = {}


def held_bytes(index: int) -> int:
    """Bytes waiting in the pool on GPU ``index``."""
    return HELD.get(index, 0)


def release(index: int) -> None:
    """Hand every pooled buffer of GPU ``index`` back to CuPy."""
    for key in [k for k in FREE if k[0] == index]:
        del FREE[key]
    HELD[index] = 0
