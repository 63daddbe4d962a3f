"""The in-process virtual cluster: results, failures, deadlocks, determinism, per-rank state."""
import time

import numpy as np
import pytest

import needle as ndl
from needle import process_state
from needle.parallel import CommTimeoutError, DeadlockError, RankFailedError, virtual
from needle.process_state import switches


def _rank_and_size(comm, offset, scale=1):
    return (comm.rank + offset) * scale, comm.size


def test_run_returns_every_rank_result_and_passes_kwargs() -> None:
    assert virtual.run(3, _rank_and_size, 10, scale=2) == [(20, 3), (22, 3), (24, 3)]
    assert virtual.run(1, _rank_and_size, 0) == [(0, 1)]
    with pytest.raises(ValueError):
        virtual.run(0, _rank_and_size, 0)


def _fail_on_rank_1(comm):
    comm.allreduce(np.ones(3))
    if comm.rank == 1:
        raise KeyError("rank 1 failed on purpose")
    return comm.allreduce(np.ones(3))  # waits for rank 1, which is gone


def test_exception_names_the_rank_and_releases_the_others_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 raised KeyError: .*on purpose") as info:
        virtual.run(3, _fail_on_rank_1, timeout=60)
    assert time.monotonic() - start < 5  # not the 60 s timeout
    err = info.value
    assert err.rank == 1 and isinstance(err.__cause__, KeyError)
    assert sorted(err.errors) == [0, 1, 2]
    # The others were released with a deadlock report that names the failed rank.
    assert isinstance(err.errors[0], DeadlockError)
    assert "rank 1: failed with KeyError" in str(err.errors[0])


def _recv_from_each_other(comm):
    return comm.recv((comm.rank + 1) % comm.size, tag=5)


def _one_rank_skips_a_collective(comm):
    if comm.rank != 2:
        comm.allreduce(np.ones(4), label="grads")
    return comm.rank


def test_deadlock_is_reported_at_once_naming_every_pending_call() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        virtual.run(2, _recv_from_each_other, timeout=60)
    assert time.monotonic() - start < 5
    assert set(info.value.errors) == {0, 1}
    for err in info.value.errors.values():
        assert isinstance(err, DeadlockError)
        text = str(err)
        assert "rank 0: waits in recv(source=1, tag=5)" in text
        assert "rank 1: waits in recv(source=0, tag=5)" in text
    with pytest.raises(RankFailedError) as info:
        virtual.run(3, _one_rank_skips_a_collective, timeout=60)
    text = str(info.value.errors[0])
    assert "rank 2: finished" in text and "rank 0: waits in allreduce (call #1)" in text
    assert isinstance(info.value.errors[1], DeadlockError) and 2 not in info.value.errors


def _caught_deadlock_then_go_on(comm):
    try:
        comm.recv(1 - comm.rank)
    except DeadlockError:
        pass
    return comm.allreduce(np.array([comm.rank + 1]))[0]


def test_ranks_may_catch_a_deadlock_and_go_on() -> None:
    assert virtual.run(2, _caught_deadlock_then_go_on) == [3, 3]


def _livelock(comm):
    if comm.rank == 0:
        comm.recv(1)  # never sent
    else:
        work = comm.irecv(0)
        for _ in range(200):  # busy, not blocked: no deadlock, so rank 0's timeout fires
            if work.test():
                break
            time.sleep(0.005)
    return comm.rank


def test_timeout_still_bounds_a_wait() -> None:
    with pytest.raises(RankFailedError, match="rank 0 raised CommTimeoutError") as info:
        virtual.run(2, _livelock, timeout=0.2)
    assert isinstance(info.value.errors[0], CommTimeoutError)
    assert "did not finish within 0.2 s" in str(info.value.errors[0])


def _abort(comm):
    if comm.rank == 0:
        comm.abort(3)
    return comm.allreduce(np.ones(1))


def test_abort_stops_every_rank() -> None:
    with pytest.raises(RankFailedError, match=r"rank 0 raised CommAbortedError: rank 0 called "
                                              r"abort\(3\)"):
        virtual.run(2, _abort)


def _nested(comm):
    return virtual.run(2, _rank_and_size, 0)


def test_run_inside_a_rank_is_an_error() -> None:
    with pytest.raises(RankFailedError, match="inside a virtual rank"):
        virtual.run(2, _nested)


def _many_senders(comm):
    """Rank 0 receives from ANY_SOURCE: the order depends only on the schedule."""
    if comm.rank == 0:
        got = [comm.recv(comm.ANY_SOURCE, tag=1, return_status=True) for _ in
               range(3 * (comm.size - 1))]
        return [(st.source, int(x[0])) for x, st in got]
    for k in range(3):
        comm.send(np.array([10 * comm.rank + k]), 0, tag=1)
    return None


def _noisy_sum(comm, n):
    rng = np.random.default_rng(comm.rank)
    x = rng.random(n).astype(np.float32) * 1e3
    return comm.allreduce(x, algorithm="ring"), comm.reduce_scatter(x), comm.allgather(x[:5])


def test_runs_are_deterministic() -> None:
    first = virtual.run(4, _many_senders)
    assert virtual.run(4, _many_senders) == first
    assert sorted(first[0]) == sorted((q, 10 * q + k) for q in (1, 2, 3) for k in range(3))
    a, b = virtual.run(3, _noisy_sum, 100_001), virtual.run(3, _noisy_sum, 100_001)
    for ra, rb in zip(a, b):
        for xa, xb in zip(ra, rb):
            assert xa.tobytes() == xb.tobytes()


def _draws_with_comm_between(comm):
    np.random.seed(comm.rank)
    out = []
    for _ in range(3):
        out.append(np.random.rand(2))
        comm.allreduce(np.ones(3))  # the baton moves between ranks here
        if comm.rank == 0:
            np.random.rand(7)  # rank 0 draws extra numbers: must not shift the others
    return np.concatenate(out)


def test_each_rank_has_its_own_global_rng() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    got = virtual.run(3, _draws_with_comm_between)
    assert np.array_equal(np.random.get_state()[1], before)  # the caller's state is back
    for r in range(3):
        np.random.seed(r)
        expect = []
        for _ in range(3):
            expect.append(np.random.rand(2))
            if r == 0:
                np.random.rand(7)
        np.testing.assert_array_equal(got[r], np.concatenate(expect))


def _same_start(comm):
    return np.random.rand()


def test_ranks_start_from_the_callers_rng_state_like_forked_processes() -> None:
    np.random.seed(7)
    got = virtual.run(3, _same_start)
    np.random.seed(7)
    assert got == [np.random.rand()] * 3


def _grad_modes(comm):
    if comm.rank == 0:
        with ndl.no_grad():
            comm.barrier()
            inside = ndl.autograd.is_grad_enabled()
        return inside, ndl.autograd.is_grad_enabled()
    comm.barrier()
    return ndl.autograd.is_grad_enabled(), ndl.autograd.LAZY_MODE


def test_grad_mode_is_per_rank() -> None:
    assert virtual.run(2, _grad_modes) == [(False, True), (True, False)]
    assert ndl.autograd.is_grad_enabled()


def _autocast_modes(comm):
    from needle import amp
    if comm.rank == 0:
        with amp.autocast("float16"):
            comm.barrier()
            return amp.autocast_dtype()
    comm.barrier()
    return amp.autocast_dtype()


def test_autocast_is_per_rank() -> None:
    assert virtual.run(2, _autocast_modes) == ["float16", None]


def test_registered_state_is_per_rank() -> None:
    box = {"v": 0}
    process_state.register(lambda: box["v"], lambda v: box.__setitem__("v", v))
    try:
        def bump(comm):
            box["v"] += comm.rank + 1
            comm.barrier()
            return box["v"]
        assert virtual.run(3, bump) == [1, 2, 3] and box["v"] == 0
    finally:
        process_state.REGISTERED.pop()


def _modes():
    return (ndl.autograd.LAZY_MODE, switches.grad_enabled, switches.autocast_dtype,
            switches.autocast_hook)


def _cast_nothing(op, args):
    return args


def _change_every_mode(comm):
    found = _modes()
    ndl.autograd.LAZY_MODE, switches.grad_enabled = True, False
    switches.autocast_dtype, switches.autocast_hook = "bfloat16", _cast_nothing
    comm.barrier()  # rank 0 changed its modes before rank 1 starts: rank 1 must not see them
    return found, _modes()


def test_a_ranks_modes_do_not_leak_to_other_ranks_or_the_caller() -> None:
    caller = _modes()
    assert caller == (False, True, None, None)
    assert virtual.run(2, _change_every_mode) == [(caller, (True, False, "bfloat16",
                                                            _cast_nothing))] * 2
    assert _modes() == caller


def test_trace_records_every_message() -> None:
    cluster = virtual.Cluster(4, trace=True)
    cluster.run(lambda comm: comm.allreduce(np.ones(1 << 16, np.float32), algorithm="ring"))
    payload = [m for m in cluster.trace if m.nbytes > 16]
    # Ring allreduce: every rank sends 2 (p - 1) segments of N / p bytes.
    assert len(payload) == 4 * 2 * 3 and all(m.nbytes == (1 << 18) // 4 for m in payload)
    assert {(m.src, m.dst) for m in payload} == {(r, (r + 1) % 4) for r in range(4)}
