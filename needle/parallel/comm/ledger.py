"""The communication ledger: what every collective and point-to-point call of a communicator sent
(usage: docs/parallel.md, "The ledger").

Each finished call appends a ``Record``: the collective (``"send"``/``"recv"`` for point to
point), the algorithm, the label, the payload bytes this rank sent and received (the argument
check's 16-byte headers and the point-to-point shape headers are not payload; they are in
``comm.stats``), the messages it sent, and the seconds from the call to its completion (for a
nonblocking call, to the ``wait``/``test`` that finished it).  Bytes are exact: a ring allreduce
of N bytes on p ranks records ``2 (p - 1) / p * N`` sent when p divides N.

Up to ``maxlen`` of the newest records are kept; older ones are folded into totals, so
``summary()`` and ``total()`` are exact over every call since the last ``reset()``.
A disabled ledger costs one attribute test per call.

What an algorithm declares it sends is ``algorithms/steps.py``; tests check it against these.
"""
import contextlib
from collections import defaultdict
from operator import itemgetter
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from ...process_state import switches


class Record(NamedTuple):
    """One finished call as seen by this rank."""

    name: str
    algorithm: str
    label: Optional[str]
    bytes_sent: int
    bytes_recv: int
    messages: int
    seconds: float
    peer: Optional[int] = None


class Ledger:
    """Records of one communicator's calls, with totals by (label, name)."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self.enabled = True
        self.maxlen = maxlen
        self._records: List[tuple] = []  # plain tuples (cheapest to append), Record on reading
        self._folded: Dict[Tuple[Optional[str], str], List[float]] = {}  # totals of dropped ones

    def add(self, record: tuple) -> None:
        """Append a record: a ``Record`` or a tuple of its fields (the communicator's)."""
        if switches.profiler is not None:  # needle.profiler records: the call on its timeline
            switches.profiler.comm(record)
        self._records.append(record)
        if len(self._records) > self.maxlen:  # fold the oldest half into the totals
            half = len(self._records) // 2
            self._accumulate(self._folded, self._records[:half])
            del self._records[:half]

    @staticmethod
    def _accumulate(totals: Dict[Tuple[Optional[str], str], List[float]],
                    records: List[tuple]) -> None:
        groups: Dict[Tuple[Optional[str], str], List[tuple]] = defaultdict(list)
        for rec in records:
            groups[(rec[2], rec[0])].append(rec)
        for key, recs in groups.items():
            tot = totals.setdefault(key, [0, 0, 0, 0, 0.0])
            tot[0] += len(recs)
            for col in range(1, 5):  # fields 3..6, summed at C speed
                tot[col] += sum(map(itemgetter(col + 2), recs))

    def _totals(self) -> Dict[Tuple[Optional[str], str], List[float]]:
        totals = {key: list(t) for key, t in self._folded.items()}
        self._accumulate(totals, self._records)
        return totals

    @property
    def records(self) -> List[Record]:
        """The kept records, oldest first."""
        return [Record(*rec) for rec in self._records]

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def reset(self) -> None:
        """Forget every record and total."""
        self._records.clear()
        self._folded.clear()

    def enable(self) -> None:
        """Record calls (the default)."""
        self.enabled = True

    def disable(self) -> None:
        """Stop recording calls."""
        self.enabled = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Record nothing inside the block."""
        was, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = was

    def _rows(self, name: Optional[str], label: Optional[str]) -> List[List[float]]:
        def under(lab: Optional[str]) -> bool:
            return label is None or lab == label or (lab or "").startswith(label + "/")
        return [t for (lab, nm), t in self._totals().items()
                if (name is None or nm == name) and under(lab)]

    def total(self, name: Optional[str] = None, label: Optional[str] = None,
              field: str = "bytes_sent") -> float:
        """Sum of ``field`` (calls, bytes_sent, bytes_recv, messages, seconds) over the calls of
        collective ``name`` under ``label`` (that label or any region inside it)."""
        col = ["calls", "bytes_sent", "bytes_recv", "messages", "seconds"].index(field)
        return sum(t[col] for t in self._rows(name, label))

    def calls(self, name: Optional[str] = None, label: Optional[str] = None) -> int:
        """Number of calls of ``name`` under ``label``."""
        return int(self.total(name, label, "calls"))

    def summary(self) -> str:
        """A table: one row per (label, collective) with calls, bytes, messages and time."""
        head = (f"{'label':<28} {'collective':<15} {'calls':>6} {'bytes_sent':>12} "
                f"{'bytes_recv':>12} {'msgs':>7} {'time_ms':>9}")
        rows = [head, "-" * len(head)]
        totals = self._totals()
        for (label, name), (calls, sent, recv, msgs, sec) in sorted(
                totals.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
            rows.append(f"{(label or '-')[:28]:<28} {name:<15} {calls:>6} {sent:>12} {recv:>12} "
                        f"{msgs:>7} {sec * 1e3:>9.3f}")
        calls, sent, recv = (sum(t[i] for t in totals.values()) for i in range(3))
        rows.append(f"{'total':<28} {'':<15} {calls:>6} {sent:>12} {recv:>12}")
        return "\n".join(rows)


class Regions:
    """The stack of ``comm.region(name)`` labels; ``label(extra)`` joins them with "/"."""

    def __init__(self) -> None:
        self._stack: List[str] = []
        self.current: Optional[str] = None

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Label every call inside the block with ``name`` (nested inside outer regions)."""
        self._stack.append(name)
        self.current = "/".join(self._stack)
        try:
            yield
        finally:
            self._stack.pop()
            self.current = "/".join(self._stack) or None

    def label(self, extra: Optional[str]) -> Optional[str]:
        """The label of a call given ``label=extra``."""
        if extra is None:
            return self.current
        return extra if self.current is None else f"{self.current}/{extra}"
