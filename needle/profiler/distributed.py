"""One trace for the whole job: each rank's clock offset to rank 0, and the gather to rank 0.

Clock offset (Cristian, "Probabilistic clock synchronization", Distributed Computing 1989):
rank 0 sends its time t0 to rank r, r answers with its time t_r, rank 0 reads t1 on arrival;
if the two legs take equally long, r's clock is ahead by ``t_r - (t0 + t1) / 2``, with an error
of at most half the round trip, so the round with the shortest trip of several is kept. It is
measured when profiling starts and when it stops; the trace uses the mean of the two. These
messages, and the gather of the records, are kept out of the communication ledger, so the
trace's communication is exactly the program's.
"""
import pickle
import time
from typing import Any, List, Optional

import numpy as np

from .events import RankRecord
from .recorder import perf_ns

ROUNDS = 8
_TAG = 30_011  # a tag of the profiler's own: the program's messages never match it


def clock_offset(comm: Any, rounds: int = ROUNDS) -> int:
    """This rank's clock minus rank 0's, in ns (0 on rank 0); collective over ``comm``."""
    with comm.ledger.paused():
        if comm.rank != 0:
            _long_wait(comm.irecv(0, _TAG))
            for i in range(rounds):
                if i:
                    comm.recv(0, _TAG)
                comm.send(np.array([perf_ns()], dtype=np.int64), 0, _TAG)
            return int(comm.recv(0, _TAG)[0])
        for r in range(1, comm.size):
            comm.send(np.array([_best_offset(comm, r, rounds)], dtype=np.int64), r, _TAG)
    return 0


def _long_wait(work: Any) -> None:
    """Wait for ``work`` past the communicator's timeout, sleeping between polls: rank 0 may
    still be busy (e.g. an app timing a single-process run on rank 0 alone)."""
    while not work.poll():
        time.sleep(0.001)


def _best_offset(comm: Any, r: int, rounds: int) -> int:
    """Rank ``r``'s offset from the ping-pong round with the shortest round trip."""
    best_trip, best = None, 0
    for _ in range(rounds):
        t0 = perf_ns()
        comm.send(np.array([t0], dtype=np.int64), r, _TAG)
        t_r = int(comm.recv(r, _TAG)[0])
        t1 = perf_ns()
        if best_trip is None or t1 - t0 < best_trip:
            best_trip, best = t1 - t0, t_r - (t0 + t1) // 2
    return best


def gather_records(comm: Any, record: RankRecord) -> Optional[List[RankRecord]]:
    """Every rank's record, in rank order, on rank 0 (None elsewhere); collective."""
    with comm.ledger.paused():
        if comm.rank != 0:
            blob = np.frombuffer(pickle.dumps(record), dtype=np.uint8)
            comm.send(blob, 0, _TAG + 1)
            return None
        out = [record]
        for r in range(1, comm.size):
            out.append(pickle.loads(np.asarray(comm.recv(r, _TAG + 1)).tobytes()))
    return out
