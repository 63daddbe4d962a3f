"""Checking that all ranks called the same collective with compatible arguments.

Ranks that disagree about the size, dtype or op would otherwise hang or compute garbage. Each
rank hashes a description of its call ("allreduce op=sum dtype=float32 ..."); a 16-byte header
holding the hash goes around a recursive-doubling exchange in which a rank poisons its header
on any difference, posted with the algorithm's first messages (``overlapped``) or inside them.
Only when the hashes differ do the ranks allgather their full descriptions, so every rank
raises the same error. A caller's integer ``context`` (DDP: its backward passes) is mixed into
the hash, not the cached description; the error carries every rank's value.
"""
import hashlib
from functools import lru_cache
from typing import Any, Callable, Dict, List

import numpy as np

from ..algorithms.ring import ring_allgather
from ..progress import Algorithm, Channel, drive

RECORD = 256  # bytes per rank in the detailed exchange: the context (int64), then the text
_MASK = (1 << 62) - 1  # hashes stay non-negative 62-bit numbers (never POISON)
_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: nearby contexts give far-apart hashes


class CallMismatchError(ValueError):
    """Ranks called a collective with different arguments; ``contexts[r]``: rank r's context."""

    def __init__(self, message: str, contexts: List[int]) -> None:
        super().__init__(message)
        self.contexts = contexts


def desc_text(desc: tuple) -> str:
    """``("allreduce", "op", "sum", ...)`` -> ``"allreduce op=sum ..."``."""
    pairs = " ".join(f"{k}={v}" for k, v in zip(desc[1::2], desc[2::2]))
    return f"{desc[0]} {pairs}".strip()


@lru_cache(maxsize=1024)
def describe_hash(desc: tuple) -> int:
    """A stable 62-bit hash of a call description (Python's ``hash`` differs between ranks)."""
    digest = hashlib.blake2b(desc_text(desc).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def with_context(h: int, context: int) -> int:
    """The hash ``h`` of a description with the caller's ``context`` mixed in."""
    return h if context == 0 else (h ^ (context * _GOLDEN)) & _MASK


def mismatch_error(transport: Any, tag: int, desc: tuple, timeout: float,
                   describe: Callable[[], str], context: int = 0) -> CallMismatchError:
    """Gather every rank's description and build the error that all ranks raise."""
    ch = Channel(transport, tag)
    mine = np.zeros(RECORD, dtype=np.uint8)
    mine[:8].view(np.int64)[0] = context
    text = desc_text(desc) + (f" context={context}" if context else "")
    raw = text.encode()[:RECORD - 8]
    mine[8:8 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    everyone = np.empty(RECORD * ch.size, dtype=np.uint8)
    drive(ring_allgather(ch, mine, everyone, RECORD), transport, timeout, describe)
    records = everyone.reshape(ch.size, RECORD)
    contexts = [int(c) for c in records[:, :8].copy().view(np.int64)[:, 0]]
    groups: Dict[str, List[int]] = {}
    for rank in range(ch.size):
        groups.setdefault(bytes(records[rank, 8:]).rstrip(b"\0").decode(), []).append(rank)
    lines = "; ".join(f"ranks {ranks}: {text}" for text, ranks in groups.items())
    return CallMismatchError(
        f"needle.parallel: ranks called a collective with different arguments (seen from rank "
        f"{ch.rank}): {lines}", contexts)


def overlapped(size: int, check: Algorithm, body: Algorithm, verify: Callable[[], None],
               overlap: bool = True) -> Algorithm:
    """The argument ``check`` with its messages in flight together with the ``body``'s first
    ones, so that it adds no round trip (``overlap=False``: the check, then the body). Safe on
    mismatched arguments: until ``verify()`` has passed the body has only *posted* messages.
    """
    if size == 1 or not overlap:
        if size > 1:
            yield from check
            verify()
        yield from body
        return
    item = next(check)  # the check's first exchange is posted first...
    first = next(body, None)  # ...then the body's first messages, which overlap it
    try:
        while True:
            item = check.send((yield item))
    except StopIteration:
        verify()
    try:
        while first is not None:
            first = body.send((yield first))
    except StopIteration:
        pass
