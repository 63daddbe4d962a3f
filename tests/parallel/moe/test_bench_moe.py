"""benchmarks/bench_moe.py at tiny sizes on 2 ranks: its ledger bytes equal the padded formula."""
import ast
import re
import subprocess
import sys

import numpy as np
import pytest
from mpi_helpers import ROOT, mpiexec, run_bounded, worker_env

P, TOKENS, D, E = 2, 16, 8, 4


@pytest.mark.mpi
def test_bench_moe_ledger_bytes_equal_the_formula() -> None:
    cmd = [mpiexec(), "-n", str(P), sys.executable, str(ROOT / "benchmarks" / "bench_moe.py"),
           "--tokens", str(TOKENS), "--d-model", str(D), "--d-ff", "16", "--experts", str(E),
           "--rounds", "1", "--steps", "1"]
    res = run_bounded(cmd, 60, cwd=ROOT, env=worker_env(), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    out = res.stdout
    table = np.array([ast.literal_eval(re.search(rf"tokens per expert from rank {r}: (\[.*\])",
                                                 out).group(1)) for r in range(P)])  # (p, E)
    assert table.shape == (P, E) and (table.sum(axis=1) <= TOKENS).all()
    # GShard-style dispatch + combine, forward and backward: 4 all-to-alls per step, each
    # sending p-1 blocks padded to the largest (source rank -> destination rank) block
    per_pair = table.reshape(P, P, E // P).sum(axis=2)
    want = 4 * (P - 1) * per_pair.max() * D * 4          # float32
    ledger = ast.literal_eval(re.search(r"all-to-all bytes sent per rank per step: ledger "
                                        r"(\[[^]]*\])", out).group(1))
    assert ledger == [want] * P, out
    counts = ast.literal_eval(re.search(r"count allgather bytes per rank per step: ledger "
                                        r"(\[[^]]*\])", out).group(1))
    assert counts == [(P - 1) * (E + 2) * 8] * P, out
    assert "max |diff| 0.00e+00" in out and "speedup" in out and "dropped at capacity" in out
