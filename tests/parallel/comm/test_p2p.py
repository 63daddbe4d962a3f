"""Point-to-point send/recv on MPI and on the virtual cluster: shapes, tags, ANY_SOURCE, stats."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

from needle.parallel import ANY_SOURCE, ANY_TAG


def arrays():
    """Arrays of every kind: 0-d, empty, bool, float16, non-contiguous, and one over the eager
    size (so its send waits for the receive)."""
    rng = np.random.default_rng(0)
    return [np.float64(3.5), np.zeros((0, 3), np.int32), rng.random(5) < 0.5,
            rng.random((2, 3, 4)).astype(np.float16), np.arange(12.0).reshape(3, 4).T,
            rng.random(300_000).astype(np.float32)]


def _send_every_kind(comm):
    if comm.rank == 0:
        for k, x in enumerate(arrays()):
            comm.send(x, 1, tag=k)
        return None
    got = [comm.recv(0, tag=k) for k in range(len(arrays()))]
    return [(g.dtype.str, g.shape, g.tobytes()) for g in got]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_of_array_arrives_intact(backend: str) -> None:
    got = run_ranks(backend, 2, _send_every_kind)[1]
    for (dtype, shape, data), x in zip(got, arrays()):
        x = np.array(x, order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        assert (dtype, shape, data) == (x.dtype.str, x.shape, x.tobytes())


def _tags_out_of_order(comm):
    if comm.rank == 0:
        comm.send(np.array([1]), 1, tag=1)
        comm.send(np.array([2]), 1, tag=2)
        comm.send(np.array([3.0]), 1, tag=3)
        return None
    second = comm.recv(0, tag=2)
    anything, st = comm.recv(0, tag=ANY_TAG, return_status=True)  # the earliest: tag 1
    out = np.empty(1)
    res = comm.recv(0, tag=3, out=out)
    return int(second[0]), int(anything[0]), st.tag, st.source, res is out


@pytest.mark.parametrize("backend", BACKENDS)
def test_tags_select_messages(backend: str) -> None:
    assert run_ranks(backend, 2, _tags_out_of_order)[1] == (2, 1, 1, 0, True)


def _any_source(comm):
    if comm.rank == 0:
        got = set()
        for _ in range(2 * (comm.size - 1)):
            x, st = comm.recv(ANY_SOURCE, tag=4, return_status=True)
            got.add((st.source, int(x[0])))
        return sorted(got)
    for k in range(2):
        comm.send(np.array([100 * comm.rank + k]), 0, tag=4)
    return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_source_receives_from_every_sender(backend: str) -> None:
    got = run_ranks(backend, 4, _any_source)[0]
    assert got == [(q, 100 * q + k) for q in (1, 2, 3) for k in range(2)]


def _ring_exchange_nonblocking(comm):
    """Every rank sends 1 MB right and receives from the left at the same time."""
    p, r = comm.size, comm.rank
    x = np.full(1 << 18, r, dtype=np.float32)
    recv = comm.irecv((r - 1) % p, tag=9, label="halo")
    send = comm.isend(x, (r + 1) % p, tag=9, label="halo")
    got = recv.wait()
    send.wait()
    rec = comm.ledger.records
    return (float(got[0]), got.size, comm.stats["send"]["bytes_sent"],
            comm.stats["recv"]["bytes_recv"], [(x.name, x.label, x.bytes_sent, x.bytes_recv,
                                                x.peer) for x in rec])


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonblocking_exchange_and_its_ledger(backend: str) -> None:
    res = run_ranks(backend, 3, _ring_exchange_nonblocking)
    for r, (first, size, sent, recvd, rec) in enumerate(res):
        assert first == (r - 1) % 3 and size == 1 << 18
        assert sent == recvd == 1 << 20  # payload only: the 192-byte headers are not counted
        assert sorted(rec) == [("recv", "halo", 0, 1 << 20, (r - 1) % 3),
                               ("send", "halo", 1 << 20, 0, (r + 1) % 3)]


def _bad_out(comm):
    if comm.rank == 0:
        comm.send(np.ones(3), 1)
        return "sent"
    try:
        comm.recv(0, out=np.empty(4))
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_into_a_wrong_out_is_an_error(backend: str) -> None:
    msg = run_ranks(backend, 2, _bad_out)[1]
    assert "out= is float64(4,) but rank 0 sent float64(3,)" in msg


def _bad_peer(comm):
    errors = []
    for call in (lambda: comm.send(np.ones(1), comm.size), lambda: comm.recv(-3),
                 lambda: comm.send(np.ones(1), 0, tag=-1)):
        try:
            call()
        except ValueError as err:
            errors.append(str(err).split(" ")[0])
    return errors


def test_bad_peers_and_tags() -> None:
    assert run_ranks("virtual", 2, _bad_peer)[0] == ["send(dest=2)", "recv(source=-3)",
                                                     "send(tag=-1)"]
