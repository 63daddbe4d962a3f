"""``python -m needle.plan``: the table, --all and --json."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_helpers import mpiexec

from needle.plan.__main__ import main
from needle.plan.cluster import measure_here

ROOT = Path(__file__).resolve().parents[2]


def test_json_lists_layouts_with_every_field(capsys):
    assert main(["--model", "gpt2-medium", "--batch", "32", "--gpus", "8", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert 1 <= len(items) <= 5
    for it in items:
        assert it["strategy"] in ("single", "ddp", "zero1", "zero2", "zero3", "tp", "pp",
                                  "tp+dp", "pp+dp", "tp+pp", "3d")
        assert it["dp"] * it["tp"] * it["pp"] == 8
        mem = it["memory_bytes"]
        cats = ("parameters", "gradients", "optimizer_state", "activations", "buffers")
        assert abs(sum(mem[c] for c in cats) - it["total_bytes"]) < 1
        assert it["fits"] is True and it["step_seconds"] > 0
    times = [it["step_seconds"] for it in items]
    assert times == sorted(times)


def test_all_lists_every_layout_with_why_not(capsys):
    assert main(["--params", "7.5e9", "--gpus", "64", "--optimizer", "adam",
                 "--precision", "mixed", "--all", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    ddp = [i for i in items if i["strategy"] == "ddp"]
    assert ddp and not ddp[0]["fits"] and ddp[0]["why_not"] == "does not fit: 120.0 GB > 80 GB"
    assert {i["strategy"] for i in items} >= {"ddp", "zero1", "zero2", "zero3"}


def test_table_prints_best_and_why_not():
    out = subprocess.run([sys.executable, "-m", "needle.plan", "--model", "gpt3-175b",
                          "--batch", "64", "--gpus", "64", "--microbatch", "1"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, check=True).stdout
    assert "Best first:" in out and "  1. " in out
    assert "does not fit" in out and "TP across nodes" in out


@pytest.mark.mpi
def test_cluster_here_measures_this_machine():
    """--cluster here: GEMM FLOP/s measured now, alpha/beta from an mpiexec ping-pong (its
    launch bounded by measure_alpha_beta's 60 s timeout)."""
    mpiexec()  # skips without mpiexec
    here = measure_here(2)
    assert here.gpus == 2 and here.peak_flops["fp32"] > 1e6
    assert 0 < here.intra_alpha < 1e-2 and 0 < here.intra_beta < 1e-6
    assert here.overlap is False


@pytest.mark.mpi
@pytest.mark.slow
def test_cluster_here_beyond_the_cores_measures_core_sharing():
    """More ranks than cores: --cluster here's efficiency is 1 / the measured slowdown of
    synchronised work (core_sharing), not 1 (each launch bounded by its timeout)."""
    mpiexec()
    ranks = len(os.sched_getaffinity(0)) + 1
    if ranks > 8:
        pytest.skip(f"{ranks - 1} cores: {ranks} ranks would take too long here")
    here = measure_here(ranks)
    assert here.gpus == ranks and 0 < here.efficiency < 1


def test_from_module_counts_each_parameter_once():
    """A needle Module is counted by walking it; a tied weight counts once."""
    from needle import nn
    from needle.plan.model import from_module

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(5, 7)
            self.b = nn.Linear(7, 5)
            self.c = self.a          # the same Linear twice

    spec = from_module(Tied())
    assert spec.num_params == (5 * 7 + 7) + (7 * 5 + 5)
    assert not spec.is_transformer


def test_precision_any_enumerates_both(capsys):
    """--precision any: fp32 and mixed layouts in one ranking; fp32 model states are 4+4+8 B."""
    assert main(["--model", "gpt2-small", "--seq", "256", "--batch", "8", "--gpus", "8",
                 "--precision", "any", "--optimizer", "adam", "--all", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert {i["precision"] for i in items} == {"fp32", "mixed"}
    ddp32 = [i for i in items if i["precision"] == "fp32" and i["strategy"] == "ddp"
             and i["recompute"] == "none" and i["microbatch"] == 1][0]
    ddp16 = [i for i in items if i["precision"] == "mixed" and i["strategy"] == "ddp"
             and i["recompute"] == "none" and i["microbatch"] == 1][0]
    m32, m16 = ddp32["memory_bytes"], ddp16["memory_bytes"]
    assert m32["parameters"] == 2 * m16["parameters"]
    assert m32["optimizer_state"] * 12 == m16["optimizer_state"] * 8
    best = [i for i in items if i["fits"]][0]
    assert best["precision"] == "mixed"   # 312 vs 19.5 TFLOP/s on an A100
