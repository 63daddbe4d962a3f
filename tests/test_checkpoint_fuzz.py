"""A small seeded run of benchmarks/fuzz_checkpoints.py: every corrupted ``ndl.load`` file and
sharded checkpoint is refused with CheckpointError or loads exactly the saved values."""
import json
import subprocess
import sys

from mpi_helpers import ROOT, worker_env

CASES = 600


def test_fuzzed_checkpoints_are_refused_or_exact():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_checkpoints.py"),
                          "--cases", str(CASES), "--seed", "0", "--json"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=worker_env())
    assert out.returncode in (0, 1), out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["failures"] == [], result["failures"][:5]
    assert sum(result["total"].values()) == CASES
    assert result["total"]["refused"] >= 0.9 * CASES  # the edits really corrupt
    kinds = {k.split(" ", 1)[1] for k in result["by_kind"]}
    assert {"flip", "cut", "zero", "insert", "delete", "header", "forged header",
            "manifest bytes", "manifest field", "forged manifest", "shard bytes",
            "shards swapped", "shard symlinked out"} <= kinds, kinds
