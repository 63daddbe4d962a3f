"""tools/gpu_check.py: its dry run (every section on the CUDA emulator, tiny sizes) writes the
report, labels every figure "emulated", and a section that fails or hangs leaves the report."""
import json
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, run_bounded, worker_env

import needle as ndl

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not getattr(ndl.cuda().mod, "EMULATED", False),
    reason="the dry run needs the CUDA emulator (NEEDLE_CUDA_EMULATOR=1 without a GPU)")]
BOUND_S = 150  # the dry run takes 30-60 s on a quiet 2-core machine


def _gpu_check(out, *args):
    res = run_bounded([sys.executable, "tools/gpu_check.py", "--dry-run", "--out", str(out),
                       *args], BOUND_S, cwd=ROOT, env=worker_env(), stdin=subprocess.DEVNULL)
    return res, json.loads((out / "report.json").read_text())


def test_dry_run_runs_every_section_on_the_emulator(tmp_path):
    res, report = _gpu_check(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
    sections = report["sections"]
    assert list(sections) == ["env", "cupy-contract", "cuda-tests", "notebook", "memcheck",
                              "racecheck", "kernels", "train-step", "step-profile",
                              "step-counts", "graphs", "emu-vs-gpu"]
    for name, sec in sections.items():
        want = "skipped" if name in ("memcheck", "racecheck") else "ok"
        assert sec["status"] == want, (name, sec.get("tail", "")[-2000:])
    assert report["mode"] == "emulated"
    rows = [r for n in ("kernels", "train-step", "emu-vs-gpu")
            for r in sections[n]["figures"]["rows"]]
    assert len(rows) >= 8 + 2 + 8 and all(r["mode"] == "emulated" for r in rows)
    assert not any("torch_GBps" in r or "torch_ms" in r for r in rows)  # no GPU to time torch
    assert all(r["ok"] for r in sections["emu-vs-gpu"]["figures"]["rows"])
    profile = sections["step-profile"]["figures"]["rows"]
    assert profile[0]["calls_per_step"] > 1000 and profile[0]["profiled_ms"] > 0
    assert {"autograd", "ops", "backend_ndarray"} <= {r.get("layer") for r in profile}
    counted = {(r["model"], r["phase"]): r for r in sections["step-counts"]["figures"]["rows"]
               if "phase" in r}
    assert {("lm", "total"), ("resnet9", "optimizer")} <= set(counted)
    assert counted[("lm", "total")]["launch"] > 0 and counted[("lm", "total")]["sync"] == 0
    graphs = sections["graphs"]["figures"]["rows"]
    assert len(graphs) == 2 and all(r["graph"] and r["max_diff_vs_plain"] == 0 for r in graphs)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# needle GPU check (emulated)") and "no figure here is a GPU" in md


def test_a_section_past_its_bound_is_killed_and_the_report_still_written(tmp_path):
    # 10 ms: not even Python starts in that time (a warm section may finish within 0.5 s)
    res, report = _gpu_check(tmp_path, "--only", "env,kernels", "--bound", "kernels=0.01")
    assert res.returncode == 1
    assert report["sections"]["env"]["status"] == "ok"
    assert report["sections"]["kernels"]["status"].startswith("timeout")
    assert "kernels | timeout" in (tmp_path / "report.md").read_text()


def test_unknown_section_is_refused(tmp_path):
    res = run_bounded([sys.executable, "tools/gpu_check.py", "--only", "gpu", "--out",
                       str(tmp_path)], 60, cwd=ROOT, env=worker_env())
    assert res.returncode == 2 and "no section ['gpu']" in res.stderr
