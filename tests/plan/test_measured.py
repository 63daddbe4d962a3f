"""Predictions against real runs under mpiexec (benchmarks/plan_worker.py), 2 ranks, bounded."""
import importlib.util
import json
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

from benchmarks.needle_strategies import (
    needle_buffer_bytes,
    needle_collectives,
    needle_tp_collectives,
)
from needle.plan.comm_time import step_bytes


def _run(strategy, ranks, tmp_path, steps=3):
    out = tmp_path / f"{strategy}.json"
    subprocess.run([mpiexec(), "-n", str(ranks), sys.executable,
                    str(ROOT / "benchmarks" / "plan_worker.py"), strategy, str(out),
                    "--steps", str(steps)], check=True, timeout=240, cwd=ROOT,
                   env=worker_env(), capture_output=True, stdin=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _bench():
    spec = importlib.util.spec_from_file_location("bench_plan",
                                                  ROOT / "benchmarks" / "bench_plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_data_parallel_bytes_exact_and_memory_within_10_percent(strategy, tmp_path):
    """MLPResNet on digits, 2 ranks: the ledger's bytes per step, to the byte; peak memory
    (MemoryTracker) within 10% of estimate_module plus needle's strategy buffers."""
    bench = _bench()
    meas = _run(strategy, 2, tmp_path)
    sizes = [int(p.size) for p in bench._digits_model().parameters()]
    assert max(meas["bytes"]) == step_bytes(needle_collectives(sizes, 4, strategy, 2))
    peak, _, _, _ = bench.predict_dp(strategy, 2)
    assert peak >= needle_buffer_bytes(sizes, 4, strategy, 2)
    assert abs(peak / max(meas["peak"]) - 1) < 0.10, (peak, meas["peak"])


@pytest.mark.mpi
@pytest.mark.slow
def test_tensor_parallel_bytes_exact(tmp_path):
    """The character transformer (4 layers, hidden 64, batch 16 x 32): tp = 2, bytes exact."""
    meas = _run("tp", 2, tmp_path, steps=2)
    assert max(meas["bytes"]) == step_bytes(needle_tp_collectives(4, 16, 32, 64, 2))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero3", "tp", "pp"])
def test_sharded_strategies_memory_within_10_percent(strategy, tmp_path):
    """2 ranks, the busiest rank's peak (MemoryTracker) within 10% of the prediction: FSDP
    with its gathered units and reduce-scatter buffers over backward (``fsdp_buffer_bytes``),
    TP from each rank's own shard and graph, PP (1F1B, 4 microbatches) from each stage's graph
    times the microbatches it keeps in flight."""
    bench = _bench()
    meas = _run(strategy, 2, tmp_path, steps=3)
    if strategy == "zero3":
        peak = bench.predict_dp("zero3", 2)[0]
    else:
        lay = bench.lm_layout(strategy, 2)
        ranks = bench._lm_memory(lay, bench._lm_spec(lay.tp)[1])
        peak = max(r[0] for r in ranks)
    assert abs(peak / max(meas["peak"]) - 1) < 0.10, (peak, meas["peak"])
