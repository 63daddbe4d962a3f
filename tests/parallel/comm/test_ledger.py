"""The communication ledger: exact bytes per collective against the formulas, labels, regions."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

from needle.parallel import virtual
from needle.parallel.comm.engine.communicator import Communicator

N = 3 * 4 * 5 * 1024  # float32 items: p in 2..5 divides N, so the formulas are exact


def _one_of_each(comm):
    x = np.ones(N, np.float32)
    comm.allreduce(x, algorithm="ring", label="ring")
    comm.allreduce(x, algorithm="recursive_doubling", label="rd")
    comm.allgather(x[:N // comm.size], label="ag")
    comm.reduce_scatter(x, label="rs")
    comm.broadcast(x, root=0, label="bc")
    comm.alltoall(x, label="a2a")
    return [tuple(r[:6]) for r in comm.ledger.records]


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_bytes_match_the_formulas(p: int) -> None:
    nb = 4 * N
    log2p = p.bit_length() - 1
    for r, recs in enumerate(virtual.run(p, _one_of_each)):
        got = {label: (name, algo, sent, recv, msgs) for name, algo, label, sent, recv, msgs
               in recs}
        assert got["ring"][:4] == ("allreduce", "ring", 2 * (p - 1) * nb // p,
                                   2 * (p - 1) * nb // p)
        assert got["ag"][2:4] == ((p - 1) * nb // p,) * 2  # output N, (p-1)/p of it moves
        assert got["rs"][2:4] == ((p - 1) * nb // p,) * 2  # input N
        assert got["a2a"][2:4] == ((p - 1) * nb // p,) * 2
        if p & (p - 1) == 0:  # recursive doubling: log2 p full exchanges
            assert got["rd"][:4] == ("allreduce", "recursive_doubling", log2p * nb, log2p * nb)
        # Binomial broadcast: every rank but the root receives N once; the sends add up to it.
        assert got["bc"][3] == (0 if r == 0 else nb)
    total_bc = sum(dict((lab, s) for _, _, lab, s, _, _ in recs)["bc"]
                   for recs in virtual.run(p, _one_of_each))
    assert total_bc == (p - 1) * nb


def _labels_and_regions(comm):
    x = np.ones(8)
    comm.allreduce(x)  # no label
    comm.allreduce(x, label="layer3.fc2")
    with comm.region("tp.forward"):
        comm.allreduce(x)
        with comm.region("attn"):
            comm.allreduce(x, label="qkv")
            w = comm.allgather_async(x)
        comm.send(x, (comm.rank + 1) % comm.size) if comm.size > 1 else None
        comm.recv((comm.rank - 1) % comm.size) if comm.size > 1 else None
    w.wait()  # finished outside the region: keeps the label it was started with
    comm.ledger.disable()
    comm.allreduce(x, label="not recorded")
    comm.ledger.enable()
    sub = comm.split(comm.rank % 2)
    sub.allreduce(x, label="sub")
    labels = [(r.name, r.label) for r in comm.ledger]
    out = (labels, comm.ledger.calls("allreduce", label="tp.forward"),
           comm.ledger.total("allreduce", label="tp.forward"), comm.ledger.summary(),
           [(r.name, r.label) for r in sub.ledger], all(r.seconds >= 0 for r in comm.ledger))
    comm.ledger.reset()
    return out + (len(comm.ledger), comm.ledger.calls())


@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_regions_reset_and_sub_communicators(backend: str) -> None:
    res = run_ranks(backend, 2, _labels_and_regions)
    labels, calls, total, summary, sub_labels, timed, after_reset, calls_after = res[0]
    assert labels == [("allreduce", None), ("allreduce", "layer3.fc2"),
                      ("allreduce", "tp.forward"), ("allreduce", "tp.forward/attn/qkv"),
                      ("send", "tp.forward"), ("recv", "tp.forward"),
                      ("allgather", "tp.forward/attn")]
    assert calls == 2 and total == 2 * 8 * 8  # recursive doubling at p=2: N bytes per call
    assert "tp.forward/attn/qkv" in summary and "layer3.fc2" in summary
    assert sub_labels == [("allreduce", "sub")] and timed
    assert after_reset == 0 and calls_after == 0
    assert res[0][:3] == res[1][:3]  # both ranks saw the same calls


def test_summary_totals_stay_exact_beyond_maxlen() -> None:
    from needle.parallel.comm.ledger import Ledger, Record

    led = Ledger(maxlen=3)
    for k in range(10):
        led.add(Record("allreduce", "ring", "a" if k % 2 else "b", 100, 50, 2, 0.001))
    assert len(led) <= 3 and led.calls() == 10
    assert led.total(label="a") == 500 and led.total("allreduce", field="bytes_recv") == 500
    assert led.summary().splitlines()[-1].split()[1:4] == ["10", "1000", "500"]


# -- what each algorithm declares it sends (select.steps) against what the ledger records ------
ROWS, COLS, PIECE = 7, 37, 1000  # rows split unevenly over 2..4 ranks; pieces of 250 float32


def _nodes(p: int) -> list:
    return [r // 2 for r in range(p)] if p % 2 == 0 else list(range(p))


def _every_algorithm(comm):
    from needle.parallel.comm.algorithms.select import ALGORITHMS
    c = Communicator(comm.transport, chunk_bytes=PIECE)
    c.nodes = _nodes(comm.size)
    flat, rows = np.ones(ROWS * COLS, np.float32), np.ones((ROWS, COLS), np.float32)
    calls = {"allreduce": lambda a: c.allreduce(flat, algorithm=a),
             "allgather": lambda a: c.allgather(flat, algorithm=a),
             "reduce_scatter": lambda a: c.reduce_scatter(rows, algorithm=a),
             "broadcast": lambda a: c.broadcast(flat, root=0, algorithm=a),
             "reduce": lambda a: c.reduce(flat, root=0, algorithm=a),
             "alltoall": lambda a: c.alltoall(rows, algorithm=a)}
    for name, row in ALGORITHMS.items():
        for a in row.steps:
            if a not in row.power_of_two or comm.size & (comm.size - 1) == 0:
                calls[name](a)
    return [(r.name, r.algorithm, r.messages, r.bytes_sent, r.bytes_recv) for r in c.ledger]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_declared_steps_equal_the_ledger(p: int) -> None:
    """Every collective and algorithm on p virtual ranks (uneven segments, several pieces):
    the messages, bytes sent and bytes received each rank's ``steps`` declare are the ledger's."""
    from needle.parallel.comm.algorithms import select
    got = virtual.run(p, _every_algorithm)
    nbytes = {"allgather": p * ROWS * COLS * 4}
    unit = {"reduce_scatter": COLS * 4, "alltoall": COLS * 4}
    seen = set()
    for k, (name, algo, _, _, _) in enumerate(got[0]):
        n = nbytes.get(name, ROWS * COLS * 4)
        s = select.steps(name, algo, n, p, unit.get(name, 4), PIECE, _nodes(p))
        msgs, sent = s.per_rank()
        to = s.dst >= 0
        recv = np.bincount(s.dst[to], weights=s.nbytes[to], minlength=p)
        for r in range(p):
            assert got[r][k] == (name, algo, msgs[r], sent[r], recv[r]), (name, algo, r)
        seen.add((name, algo))
    assert len(seen) == (10 if p != 3 else 8) and sum(msgs) > 0
