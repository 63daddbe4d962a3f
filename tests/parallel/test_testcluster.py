"""The test cluster (network namespaces as hosts) and needle across its hosts over TCP.

2 hosts x 2 ranks: ranks 0, 1 on host 0 and 2, 3 on host 1 (the hostfile's order).  Collectives
equal numpy's results, the bytes a ring allreduce must send across the host link are counted on
the link itself, DDP and FSDP equal one process, and the ledger's bytes per step equal the same
run's on one host.  Each test skips, with the reason, where namespaces cannot be made.
"""
import subprocess
import sys

import numpy as np
import pytest
from dp_helpers import (
    OPTIMIZERS,
    SEED,
    assert_histories_equal,
    build,
    local_slice,
    loss_of,
    reference,
    snapshot,
)
from mpi_helpers import ROOT, run_ranks, worker_env
from multihost_helpers import make_cluster, run_on_hosts

from needle.parallel import DistributedDataParallel, FullyShardedDataParallel
from tools.testcluster import ClusterUnavailable, NamespaceHosts, netns
from tools.testcluster.netns import leftovers

pytestmark = [pytest.mark.mpi, pytest.mark.multihost]
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    yield from make_cluster(hosts=2, slots=2)


def collectives(comm):
    """Where this rank runs, and one call of each collective on rank-dependent data."""
    from mpi4py import MPI
    r = comm.rank
    x = np.arange(10, dtype=np.float64) * (r + 1)
    return {
        "host": MPI.Get_processor_name(),
        "node": MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size(),
        "allreduce": comm.allreduce(x),
        "allreduce_rd": comm.allreduce(x, algorithm="recursive_doubling"),
        "allreduce_ring": comm.allreduce(np.full(MIB // 4, r + 1.0), algorithm="ring")[::4096],
        "allgather": comm.allgather(x[:3] + r),
        "reduce_scatter": comm.reduce_scatter(np.arange(8.0) * (r + 1)),
        "broadcast": comm.broadcast(x if r == 1 else np.zeros(10), root=1),
        "alltoall": comm.alltoall(np.arange(8.0) + 10 * r),
        "allreduce_auto": comm.allreduce(np.full(MIB // 8, r + 1.0))[::4096],
        "algorithms": [rec.algorithm for rec in comm.ledger if rec.name == "allreduce"],
        "nodes": comm.hosts(),  # found by create()
        "split_nodes": comm.split(0, r).hosts(),  # found by exchanging messages
    }


def test_collectives_across_hosts_equal_numpy_and_cross_the_link(cluster):
    before = [cluster.link_bytes(i) for i in range(2)]
    got = run_on_hosts(cluster, 4, collectives, timeout=120)
    after = [cluster.link_bytes(i) for i in range(2)]
    assert [g["host"] for g in got] == [cluster.ns(0)] * 2 + [cluster.ns(1)] * 2
    assert [g["node"] for g in got] == [2, 2, 2, 2]
    # the communicator found the hosts and picked the hierarchical allreduce for 1 MiB
    nodes = got[0]["nodes"]
    assert nodes == [cluster.ns(0)] * 2 + [cluster.ns(1)] * 2
    assert all(g["nodes"] == nodes and g["split_nodes"] == nodes for g in got)
    assert got[0]["algorithms"] == ["recursive_doubling", "recursive_doubling", "ring",
                                    "hierarchical"]
    x = np.arange(10, dtype=np.float64)
    for r, g in enumerate(got):
        np.testing.assert_array_equal(g["allreduce"], x * 10)
        np.testing.assert_array_equal(g["allreduce_rd"], x * 10)
        np.testing.assert_array_equal(g["allreduce_ring"], np.full(64, 10.0))
        np.testing.assert_array_equal(g["allreduce_auto"], np.full(32, 10.0))
        np.testing.assert_array_equal(g["allgather"],
                                      np.concatenate([x[:3] * (q + 1) + q for q in range(4)]))
        np.testing.assert_array_equal(g["reduce_scatter"], np.arange(2 * r, 2 * r + 2) * 10.0)
        np.testing.assert_array_equal(g["broadcast"], x * 2)
        np.testing.assert_array_equal(g["alltoall"], np.concatenate(
            [np.arange(2 * r, 2 * r + 2) + 10.0 * q for q in range(4)]))
    # The ring on ranks 0-1 | 2-3: one ring edge leaves each host, and each edge
    # carries 2 (p - 1) / p of the 1 MiB array: 1.5 MiB in each direction of the link.
    for i in range(2):
        sent, recvd = after[i][0] - before[i][0], after[i][1] - before[i][1]
        assert sent >= 1.5 * MIB and recvd >= 1.5 * MIB, (i, sent, recvd)


def train_ddp_fsdp(comm, steps):
    """DDP's and FSDP's parameters after each step, and DDP's ledger bytes per step."""
    out = {}
    for name in ("ddp", "fsdp"):
        model = build("mlp", SEED + comm.rank)
        net = FullyShardedDataParallel(model, comm) if name == "fsdp" else \
            DistributedDataParallel(model, comm)
        opt = OPTIMIZERS["adam"](net.parameters())
        history, per_step = [], []
        for step in range(steps):
            comm.ledger.reset()
            loss = loss_of(net, *local_slice(comm.rank, comm.size, step))
            opt.reset_grad()
            loss.backward()
            opt.step()
            per_step.append((comm.ledger.total(), comm.ledger.calls()))
            history.append(list(net.full_state_dict().values()) if name == "fsdp"
                           else snapshot(model))
        out[name], out[name + "_ledger"] = history, per_step
    return out


def test_ddp_and_fsdp_across_hosts_equal_one_process_and_ledger_as_on_one_host(cluster):
    want = reference("mlp", "adam", steps=3)
    got = run_on_hosts(cluster, 4, train_ddp_fsdp, 3, timeout=180)
    one_host = run_ranks("mpi", 4, train_ddp_fsdp, 3, timeout=180)
    for r in range(4):
        assert_histories_equal(got[r]["ddp"], want)
        assert_histories_equal(got[r]["fsdp"], want)
        for name in ("ddp_ledger", "fsdp_ledger"):
            assert got[r][name] == one_host[r][name], (r, name)
            assert all(b > 0 for b, _ in got[r][name])


def test_launcher_runs_across_hosts_with_rank_prefixes(cluster, tmp_path):
    script = tmp_path / "where.py"
    script.write_text("from mpi4py import MPI\n"
                      "print('on', MPI.Get_processor_name())\n")
    cmd = [sys.executable, "-m", "tools.testcluster", "launch", str(cluster.folder),
           "-n", "4", str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=ROOT,
                         env=worker_env(), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    want = [f"[{r}] on {cluster.ns(r // 2)}" for r in range(4)]
    assert sorted(res.stdout.splitlines()) == want


def test_cluster_up_makes_hosts_and_down_removes_them():
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"no test cluster here: {reason}")
    with NamespaceHosts(3, slots=1, rate="100mbit") as c:
        assert c.hostfile.read_text() == "".join(f"{c.address(i)}:1\n" for i in range(3))
        assert sorted(n for n in leftovers() if n.startswith(c.name + "-")) == \
            sorted([c.bridge_ns] + [c.ns(i) for i in range(3)])
        qdisc = subprocess.run(["tc", "-n", c.ns(1), "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc, qdisc
    assert not [n for n in leftovers() if n.startswith(c.name + "-")]
    assert not c.folder.exists()


def test_cluster_refuses_clearly_without_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterUnavailable, match="needs root"):
        NamespaceHosts(2).up()


@pytest.mark.parametrize("hosts, slots, rate, match", [
    (0, 1, None, "hosts"), (2, 0, None, "slots"), (2, 1, "fast", "rate 'fast'")])
def test_cluster_bad_arguments(hosts, slots, rate, match):
    with pytest.raises(ValueError, match=match):
        NamespaceHosts(hosts, slots, rate)


def test_command_line_up_and_down():
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"no test cluster here: {reason}")
    cli = [sys.executable, "-m", "tools.testcluster"]
    up = subprocess.run(cli + ["up", "--hosts", "2", "--slots", "3"], capture_output=True,
                        text=True, timeout=60, cwd=ROOT, env=worker_env())
    folder = up.stdout.strip()
    name = folder.rstrip("/").split("/")[-1]
    try:
        assert up.returncode == 0, up.stderr
        lines = open(f"{folder}/hostfile").read().split()
        assert len(lines) == 2 and all(line.endswith(":3") for line in lines)
        assert len([n for n in leftovers() if n.startswith(name + "-")]) == 3  # 2 hosts, bridge
    finally:
        down = subprocess.run(cli + ["down", folder], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env=worker_env())
    assert down.returncode == 0, down.stderr
    assert not [n for n in leftovers() if n.startswith(name + "-")]
