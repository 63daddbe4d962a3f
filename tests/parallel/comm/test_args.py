"""Arguments checked against the group on every transport: a bad root, peer, tag, op or dtype
raises naming the argument, the value, the rank and the call (never a silent wrong answer)."""
import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

# (call, what the error must say): each bad call is the same on every rank
CASES = [
    ("broadcast(root=5)", "broadcast(root=5) on rank {r} of 2"),
    ("broadcast(root=-1)", "broadcast(root=-1) on rank {r} of 2"),
    ("broadcast(root=1.0)", "root must be an int rank"),
    ("broadcast(root=True)", "root must be an int rank"),
    ("reduce(root=2)", "reduce(root=2) on rank {r} of 2"),
    ("reduce(op='mean')", "reduce(op='mean') on rank {r} of 2: unknown op"),
    ("allreduce(op='mean')", "allreduce(op='mean') on rank {r} of 2: unknown op"),
    ("allreduce(op='avg', bool)", "op='avg' is not defined for bool"),
    ("allreduce(object)", "dtype object cannot be reduced"),
    ("reduce_scatter(str)", "dtype <U1 cannot be reduced"),
    ("allgather(object)", "dtype object cannot be sent"),
    ("send(dest=7)", "send(dest=7) on rank {r} of 2: dest must be a rank"),
    ("send(tag=-3)", "send(tag=-3) on rank {r} of 2: tag must be in"),
    ("recv(source=2)", "recv(source=2) on rank {r} of 2: source must be a rank"),
    ("recv(tag=-5)", "recv(tag=-5) on rank {r} of 2: tag must be in"),
    ("recv(out=strided)", "recv on rank {r} of 2: out must be a writeable C-contiguous numpy "
                          "array, not a strided float64(4,) array"),
    ("recv(out=list)", "recv on rank {r} of 2: out must be a numpy array, not list"),
]


def _call(comm, case):
    x = np.arange(4.0)
    calls = {
        "broadcast(root=5)": lambda: comm.broadcast(x, root=5),
        "broadcast(root=-1)": lambda: comm.broadcast(x, root=-1),
        "broadcast(root=1.0)": lambda: comm.broadcast(x, root=1.0),
        "broadcast(root=True)": lambda: comm.broadcast(x, root=True),
        "reduce(root=2)": lambda: comm.reduce(x, root=2),
        "reduce(op='mean')": lambda: comm.reduce(x, op="mean"),
        "allreduce(op='mean')": lambda: comm.allreduce(x, op="mean"),
        "allreduce(op='avg', bool)": lambda: comm.allreduce(x > 1, op="avg"),
        "allreduce(object)": lambda: comm.allreduce(np.array([1, "a"], dtype=object)),
        "reduce_scatter(str)": lambda: comm.reduce_scatter(np.array(["a", "b"])),
        "allgather(object)": lambda: comm.allgather(np.array([1, None], dtype=object)),
        "send(dest=7)": lambda: comm.send(x, dest=7),
        "send(tag=-3)": lambda: comm.send(x, dest=1 - comm.rank, tag=-3),
        "recv(source=2)": lambda: comm.recv(source=2),
        "recv(tag=-5)": lambda: comm.recv(source=1 - comm.rank, tag=-5),
        "recv(out=strided)": lambda: comm.recv(1 - comm.rank, out=np.zeros((4, 2))[:, 0]),
        "recv(out=list)": lambda: comm.recv(1 - comm.rank, out=[0.0] * 4),
    }
    calls[case]()


def _every_bad_call(comm):
    """Each bad call's error message on this rank, then one good call (nothing out of step)."""
    got = []
    for case, _ in CASES:
        try:
            _call(comm, case)
            got.append(None)
        except (ValueError, TypeError) as err:
            got.append(str(err))
    return got, comm.broadcast(np.arange(3.0) * (comm.rank + 1), root=1).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_name_the_argument_value_rank_and_call(backend: str) -> None:
    for r, (errors, after) in enumerate(run_ranks(backend, 2, _every_bad_call, timeout=60,
                                                  env={"NEEDLE_COMM_TIMEOUT": "5"})):
        for (case, want), err in zip(CASES, errors):
            assert err is not None, f"{case} on rank {r} did not raise"
            assert want.format(r=r) in err, (case, err)
        assert after == [0.0, 2.0, 4.0]  # the root's array: the group is still in step


def _split_with_a_str_key(comm):
    comm.split(comm.rank, key="a")


def test_split_key_and_timeout_are_checked(monkeypatch):
    from needle.parallel import RankFailedError, virtual
    with pytest.raises(RankFailedError, match="split\\(key='a'\\) on rank 0 of 2: key must be "
                                              "an int, not str"):
        virtual.run(2, _split_with_a_str_key)
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds in "
                                         r"\(0, 1e\+06\], got 0 \(timeout=\)"):
        virtual.run(2, _split_with_a_str_key, timeout=0)
    monkeypatch.setenv("NEEDLE_COMM_TIMEOUT", "abc")
    with pytest.raises(ValueError, match="got 'abc' \\(NEEDLE_COMM_TIMEOUT\\)"):
        virtual.run(2, _split_with_a_str_key)


def _nothing(comm):
    return comm.rank


def _zero_chunk(comm):
    from needle.parallel.comm.engine.communicator import Communicator
    Communicator(comm.transport, chunk_bytes=0)


def test_ring_chunk_and_thresholds_from_the_environment_are_checked(monkeypatch):
    """NEEDLE_RING_CHUNK / NEEDLE_*_SMALL that are not byte counts raise naming the variable
    (not int()'s own message), and 0 is refused, not replaced by the default."""
    import importlib

    from needle.parallel import RankFailedError, virtual
    from needle.parallel.comm.algorithms import select
    from needle.parallel.comm.engine import args
    bad = (ValueError, RankFailedError)
    for raw, why in (("", "number of bytes"), ("1M", "number of bytes"), ("0", "at least 1")):
        monkeypatch.setenv("NEEDLE_RING_CHUNK", raw)
        with pytest.raises(bad, match=f"NEEDLE_RING_CHUNK must be.*{why}"):
            virtual.run(2, _nothing)
    monkeypatch.delenv("NEEDLE_RING_CHUNK")
    assert virtual.run(2, _nothing) == [0, 1]
    with pytest.raises(bad, match="chunk_bytes must be at least 1 byte, got 0"):
        virtual.run(2, _zero_chunk)
    monkeypatch.setenv("NEEDLE_ALLGATHER_SMALL", "big")
    with pytest.raises(ValueError, match="NEEDLE_ALLGATHER_SMALL must be a number of bytes"):
        importlib.reload(select)
    monkeypatch.setenv("NEEDLE_ALLGATHER_SMALL", "1024")
    assert importlib.reload(select).ALLGATHER_SMALL == 1024
    monkeypatch.delenv("NEEDLE_ALLGATHER_SMALL")
    importlib.reload(select)
    assert args.env_bytes("NEEDLE_NOT_SET_ANYWHERE", 7) == 7


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-1", "0", "1e7", "", "soon", "1e400"])
def test_a_bad_comm_timeout_is_named_before_any_wait(monkeypatch, raw):
    """NEEDLE_COMM_TIMEOUT of nan or inf turned every deadline off (a dead rank hung the rest
    for ever); negative, zero, beyond 1e6 s or not a number: each raises naming the variable."""
    from needle.parallel import RankFailedError, virtual
    from needle.parallel.comm.engine import args
    monkeypatch.setenv("NEEDLE_COMM_TIMEOUT", raw)
    with pytest.raises((ValueError, RankFailedError),
                       match=f"timeout must be a finite number of seconds.*{raw!r}"
                             r".*\(NEEDLE_COMM_TIMEOUT\)"):
        virtual.run(2, _nothing)
    with pytest.raises(ValueError, match=r"\(timeout=\)"):
        args.check_timeout(float(raw) if raw in ("nan", "inf") else raw, "timeout=")
    monkeypatch.setenv("NEEDLE_COMM_TIMEOUT", "2.5")
    assert virtual.run(2, _nothing) == [0, 1] and args.check_timeout("2.5") == 2.5


def test_mpi_start_up_watchdog_refuses_a_bad_comm_timeout():
    """start_mpi's watchdog read NEEDLE_COMM_TIMEOUT with float(): nan never fired, 'soon'
    ended in float()'s own traceback. It now raises naming the variable, before forking."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, NEEDLE_COMM_TIMEOUT="nan", PMI_SIZE="2", PMI_RANK="0")
    code = ("import sys; from needle.parallel import faults\n"
            "sys.modules.pop('mpi4py.MPI', None)\nfaults.start_mpi('test')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "ValueError: the communicator timeout must be a finite number" in out.stderr
    assert "'nan' (NEEDLE_COMM_TIMEOUT)" in out.stderr


def test_polls_before_yield_from_the_environment_is_a_whole_count(monkeypatch):
    """NEEDLE_POLLS_BEFORE_YIELD went through int(): '٣' read as 3, '-5' as -5 polls."""
    from needle.numbers import NumberError
    from needle.parallel.comm.transport.mpi import _spin_polls
    for raw in ("-5", "٣", "2.5", "many"):
        monkeypatch.setenv("NEEDLE_POLLS_BEFORE_YIELD", raw)
        with pytest.raises(NumberError, match=f"NEEDLE_POLLS_BEFORE_YIELD {raw!r} must be a "
                                              "whole number >= 0"):
            _spin_polls(None)


def test_tag_bounds_are_half_open():
    """Tags lie in [0, tag_ub): tag_ub itself is refused, tag_ub - 1 accepted (an MPI tag
    above the bound fails only inside MPI, far from the call)."""
    from needle.parallel.comm.engine.args import check_tag
    assert check_tag("send", 31, 32, 0, 2) == 31 and check_tag("send", 0, 32, 0, 2) == 0
    with pytest.raises(ValueError, match=r"send\(tag=32\) on rank 0 of 2: tag must be in "
                                         r"\[0, 32\)"):
        check_tag("send", 32, 32, 0, 2)
