"""Checking that all ranks called the same collective with compatible arguments.

A collective whose ranks disagree about the size, dtype or op would otherwise hang (a receive
that never matches) or, worse, silently compute garbage.  Each rank therefore describes its call
as a short string ("allreduce op=sum dtype=float32 shape=(4, 3) ..."), hashes it to an integer h
and runs a recursive-doubling exchange of a 16-byte header holding h
(``latency_bound.recursive_doubling_allreduce`` with no payload): each step compares the
partner's header with its own and poisons its own on a difference, so every rank ends with h iff
all ranks hashed the same string.  The exchange is posted together with the algorithm's first
messages (``communicator._overlapped``), so it adds no round trip: the algorithm only waits for a
message once the check has passed.  The latency-bound algorithms (recursive doubling allreduce
and allgather, recursive halving reduce-scatter) carry the same header inside their data
messages instead, so they send no message of their own for it.

Only when the hashes differ do the ranks exchange their full description strings (a ring
allgather of fixed-size byte records) so that every rank can raise the same ``ValueError``
naming the ranks and their arguments.
"""
import hashlib
from functools import lru_cache
from typing import Any, Callable, Dict, List

import numpy as np

from .latency_bound import POISON, RecursiveDoublingBuffers
from .progress import Channel, drive
from .ring import ring_allgather

RECORD = 256  # bytes per rank in the detailed exchange


def desc_text(desc: tuple) -> str:
    """``("allreduce", "op", "sum", ...)`` -> ``"allreduce op=sum ..."``."""
    pairs = " ".join(f"{k}={v}" for k, v in zip(desc[1::2], desc[2::2]))
    return f"{desc[0]} {pairs}".strip()


@lru_cache(maxsize=1024)
def describe_hash(desc: tuple) -> int:
    """A stable 62-bit hash of a call description (Python's ``hash`` differs between ranks)."""
    digest = hashlib.blake2b(desc_text(desc).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def fill_header(bufs: RecursiveDoublingBuffers, desc: tuple) -> None:
    """Write the header for ``desc`` after the payload of ``bufs.work``."""
    h = describe_hash(desc)
    bufs.hmv[0] = bufs.hmv[1] = h


def header_agrees(bufs: RecursiveDoublingBuffers) -> bool:
    """After the exchange: did every rank contribute the same hash?"""
    return bufs.hmv[0] != POISON


def mismatch_error(transport: Any, tag: int, desc: tuple, timeout: float,
                   describe: Callable[[], str]) -> ValueError:
    """Gather every rank's description and build the error that all ranks raise."""
    ch = Channel(transport, tag)
    mine = np.zeros(RECORD, dtype=np.uint8)
    raw = desc_text(desc).encode()[:RECORD]
    mine[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    everyone = np.empty(RECORD * ch.size, dtype=np.uint8)
    drive(ring_allgather(ch, mine, everyone, RECORD), transport, timeout, describe)
    groups: Dict[str, List[int]] = {}
    for rank in range(ch.size):
        text = bytes(everyone[rank * RECORD:(rank + 1) * RECORD]).rstrip(b"\0").decode()
        groups.setdefault(text, []).append(rank)
    lines = "; ".join(f"ranks {ranks}: {text}" for text, ranks in groups.items())
    return ValueError(
        f"needle.parallel: ranks called a collective with different arguments (seen from rank "
        f"{ch.rank}): {lines}")
