"""needle.profiler on 2 ranks: a DDP step and a 2-stage pipeline step, each profiled on every
rank, give one trace (rank 0 writes it) with a track per rank, op, kernel (emulated CUDA for
DDP; compiled programs' fused kernels for the CPU-only pipeline) and communication events and
memory counters; its communication bytes equal each rank's ledger."""
import json
import os
from collections import defaultdict

import numpy as np
import pytest
from mpi_helpers import BACKENDS, run_ranks

import needle as ndl
from needle import nn, profiler
from needle.process_state import switches

DEVICE_TIMEOUT = 240  # s, the whole mpiexec job (two emulated-CUDA ranks on a shared machine)


def _device():
    """The emulated (or real) GPU when there is one, so kernels appear; else the CPU."""
    return ndl.cuda() if ndl.cuda().enabled() else ndl.cpu()


def _mse(out, y):
    return ((out - y) ** 2).sum()


def ddp_step(comm, path):
    """One DistributedDataParallel step (two buckets) profiled on every rank."""
    from needle.parallel import DistributedDataParallel
    np.random.seed(0)
    dev = _device()
    model = nn.Sequential(nn.Linear(8, 16, device=dev), nn.ReLU(), nn.Linear(16, 4, device=dev))
    ddp = DistributedDataParallel(model, comm, bucket_cap_mb=256 / 2**20, first_bucket_mb=1e-4)
    opt = ndl.optim.SGD(ddp.parameters(), lr=0.1)
    rng = np.random.RandomState(comm.rank)
    x = ndl.Tensor(rng.randn(6, 8), device=dev, dtype="float32", requires_grad=False)
    y = ndl.Tensor(rng.randn(6, 4), device=dev, dtype="float32", requires_grad=False)
    comm.ledger.reset()
    with profiler.profile(comm=comm) as prof:
        with profiler.record_function("train_step"):
            _mse(ddp(x), y).backward()
            opt.step()
    return _result(comm, prof, path)


def pipeline_step(comm, path, compiled=False):
    """One 1F1B step of a 2-stage pipeline (4 microbatches) profiled on every rank; with
    ``compiled``, each stage runs as an ``ndl.compile`` plan (its steps are the kernels: the
    pipeline runs on the CPU)."""
    from needle.backend_ndarray import fused_elementwise_cpu
    from needle.parallel.pipeline import PipelineParallel, partition
    np.random.seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(6, 6), nn.ReLU()) for _ in range(comm.size)])
    stage = partition(model, comm.size)[comm.rank]
    engine, fused_elementwise_cpu.ENGINE = fused_elementwise_cpu.ENGINE, "numpy"  # no numba
    try:
        pipe = PipelineParallel(ndl.compile(stage) if compiled else stage, comm, 4,
                                loss_fn=_mse)
        rng = np.random.RandomState(0)
        x, y = rng.randn(8, 6).astype(np.float32), rng.randn(8, 6).astype(np.float32)
        pipe.train_step(x, y)  # compiles (and replays once more below, unprofiled)
        pipe.train_step(x, y)
        comm.ledger.reset()
        with profiler.profile(comm=comm) as prof:
            pipe.train_step(x, y)
    finally:
        fused_elementwise_cpu.ENGINE = engine
    return _result(comm, prof, path)


def _result(comm, prof, path):
    """What each rank's ledger recorded while profiling; rank 0 also writes the trace."""
    written = prof.export_chrome_trace(path)
    return {"rank": comm.rank, "written": written, "calls": comm.ledger.calls(),
            "sent": comm.ledger.total(), "recv": comm.ledger.total(field="bytes_recv"),
            "summary": prof.summary() if comm.rank == 0 else ""}


def _by_pid(trace):
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        out[e["pid"]].append(e)
    return out


def _check_job_trace(results, path, kernels, cats=("op", "module", "backward", "comm")):
    assert [r["written"] for r in results] == [str(path), None]  # rank 0 wrote, alone
    trace = profiler.check_trace(str(path))
    per_rank = _by_pid(trace)
    assert sorted(per_rank) == [0, 1]
    for res in results:
        events = per_rank[res["rank"]]
        names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
        assert names == {f"rank {res['rank']}"}
        found = {e.get("cat") for e in events if e["ph"] == "X"}
        assert set(cats) <= found, found
        if kernels:
            launched = [e for e in events if e.get("cat") == "kernel"]
            assert launched and all(k["args"]["grid"] and k["args"]["block"] for k in launched)
            assert all(k["tid"] == 1 for k in launched)  # on the rank's "kernels" track
        assert any(e["ph"] == "C" and e["name"].startswith("memory") for e in events)
        assert any(e["ph"] == "i" and e["name"].startswith("peak memory") for e in events)
        comms = [e for e in events if e.get("cat") == "comm"]
        assert len(comms) == res["calls"] > 0
        assert sum(e["args"]["bytes_sent"] for e in comms) == res["sent"]
        assert sum(e["args"]["bytes_recv"] for e in comms) == res["recv"]
    return per_rank


@pytest.mark.parametrize("backend", BACKENDS)
def test_ddp_step_gives_one_trace_whose_messages_are_the_ledgers(backend, tmp_path):
    path = tmp_path / "ddp.json"
    results = run_ranks(backend, 2, ddp_step, str(path), timeout=DEVICE_TIMEOUT)
    per_rank = _check_job_trace(results, path, kernels=ndl.cuda().enabled())
    for events in per_rank.values():
        kinds = {e["name"] for e in events if e.get("cat") == "comm"}
        assert "allreduce" in kinds
        buckets = [e for e in events if e.get("cat") == "bucket"]
        assert len(buckets) == 2  # each bucket's launch is marked
        user = [e for e in events if e.get("cat") == "user_annotation"]
        assert [e["name"] for e in user] == ["train_step"]
        assert any(e.get("cat") == "optimizer" for e in events)
    assert "communication by kind" in results[0]["summary"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_step_gives_one_trace_whose_messages_are_the_ledgers(backend, tmp_path):
    path = tmp_path / "pipe.json"
    results = run_ranks(backend, 2, pipeline_step, str(path), timeout=DEVICE_TIMEOUT)
    per_rank = _check_job_trace(results, path, kernels=False)  # the pipeline runs on the CPU
    for events in per_rank.values():
        kinds = {e["name"] for e in events if e.get("cat") == "comm"}
        assert ("send" in kinds) and ("recv" in kinds)
    # compiled stages: their plans' steps and fused kernels are on each rank's kernels track
    fused = tmp_path / "pipe_compiled.json"
    results = run_ranks(backend, 2, pipeline_step, str(fused), True, timeout=DEVICE_TIMEOUT)
    for events in _check_job_trace(results, fused, False, ("program_step", "comm")).values():
        steps = [e for e in events if e.get("cat") == "program_step"]
        assert any(e["args"]["fused"] for e in steps) and all(e["tid"] == 1 for e in steps)
    # Both ranks' clocks are aligned: their events overlap in time on the job's axis.
    spans = {r: (min(e["ts"] for e in ev if e["ph"] == "X"),
                 max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X"))
             for r, ev in per_rank.items()}
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
    offsets = json.loads(path.read_text())["otherData"]
    assert set(offsets) == {"rank 0", "rank 1"}


def test_trace_is_not_written_when_off(tmp_path):
    """Nothing recorded outside a profile: the hooks are reset once it ends."""
    with profiler.profile():
        pass
    assert switches.profiler is None
    assert os.listdir(tmp_path) == []


def fsdp_step(comm):
    """One FSDP step profiled on every rank: its gathers, reduce-scatters and buckets."""
    from needle.parallel import FullyShardedDataParallel
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    fsdp = FullyShardedDataParallel(model, comm)
    opt = ndl.optim.SGD(fsdp.parameters(), lr=0.1)
    rng = np.random.RandomState(comm.rank)
    x = ndl.Tensor(rng.randn(6, 8), dtype="float32", requires_grad=False)
    y = ndl.Tensor(rng.randn(6, 4), dtype="float32", requires_grad=False)
    comm.ledger.reset()
    with profiler.profile(comm=comm) as prof:
        _mse(fsdp(x), y).backward()
        opt.step()
    comm_events = [e for e in prof.events() if e.cat == "comm"]
    return ({e.name for e in comm_events}, sum(e.args["bytes_sent"] for e in comm_events),
            comm.ledger.total(), len([e for e in prof.events() if e.cat == "bucket"]))


def test_fsdp_gathers_reduce_scatters_and_buckets_are_on_the_timeline():
    for kinds, sent, ledger_sent, buckets in run_ranks("virtual", 2, fsdp_step):
        assert {"allgather", "reduce_scatter"} <= kinds
        assert sent == ledger_sent > 0
        assert buckets >= 1


SHIFT_NS = 3 * 10**9  # rank 1's clock runs 3 s ahead of rank 0's


def shifted_allreduce(comm):
    """Profile one allreduce; the merged trace (rank 0's) and this rank's measured offset."""
    with profiler.profile(comm=comm) as prof:
        with profiler.record_function("allreduce"):
            comm.allreduce(np.ones(4))
    records = prof.gather()
    return prof.record.offset_ns, (profiler.chrome_trace(records) if records else None)


def test_a_rank_whose_clock_is_ahead_is_aligned_to_rank_0(monkeypatch):
    import threading

    from needle.profiler import distributed, recorder
    real = recorder.perf_ns

    def clock():
        ahead = threading.current_thread().name.endswith("rank-1")
        return real() + (SHIFT_NS if ahead else 0)
    monkeypatch.setattr(recorder, "perf_ns", clock)
    monkeypatch.setattr(distributed, "perf_ns", clock)
    (off0, trace), (off1, _) = run_ranks("virtual", 2, shifted_allreduce)
    assert off0 == 0 and abs(off1 - SHIFT_NS) < 50 * 10**6  # within half a round trip
    spans = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e.get("name") == "allreduce" and e.get("cat") == "user_annotation"}
    # the two ranks' allreduce ranges overlap on the job's time axis (unaligned: 3 s apart)
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
