"""One command that checks needle on a real GPU and writes a report (Markdown and JSON).

    python tools/gpu_check.py               # on a GPU machine: at most 8 minutes on one H100
    python tools/gpu_check.py --dry-run     # every section on the CUDA emulator, tiny sizes
    make gpu-check

Sections, each in a process of its own with its own time bound, so that one that fails or
hangs still leaves the report: the environment; the CuPy contract tests; the CUDA-marked
tests against real CuPy; the hw3 CUDA notebook; compute-sanitizer memcheck and racecheck over
the kernel tests; kernel benchmarks beside PyTorch (GB/s, TFLOP/s, and the card's peak); one
training step of ResNet9 and of the transformer LM beside PyTorch eager, where the
LM step's time goes and what each step asks of the GPU (counted on the emulator); the emulator's
results against the GPU's. The report goes to ``$OUT`` when set, else
``build/gpu-check/``. A dry run labels every figure "emulated": none of them is a GPU figure.
"""
import argparse
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
SECTIONS_PY = str(ROOT / "tools" / "gpu_check_sections.py")
PY = sys.executable
BUDGET_S = 480  # the whole check on one H100: 8 minutes
# the tests that launch every kernel (float32: the sanitizers slow each launch many times)
KERNEL_TESTS = ("tests/backend_cuda/test_cuda_backend.py", "tests/backend_cuda/test_cuda_fused.py")


class Section(NamedTuple):
    """One part of the check: its command (GPU, dry run) and its time bound in seconds."""

    name: str
    what: str
    gpu: Optional[List[str]]
    dry: Optional[List[str]]  # None: not run in a dry run (``why_not_dry`` says why)
    bound_s: float
    dry_bound_s: float
    why_not_dry: str = ""


def _pytest(*args: str) -> List[str]:
    return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--maxfail=25", *args]


def _compute_sanitizer() -> str:
    """compute-sanitizer on PATH, else where CUDA installs it."""
    found = shutil.which("compute-sanitizer")
    for pattern in ("/usr/local/cuda/bin/compute-sanitizer",
                    "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
                    "/opt/nvidia/*/compute-sanitizer"):
        found = found or next(iter(sorted(glob.glob(pattern))), None)
    return found or "compute-sanitizer"


def _sanitizer(tool: str) -> List[str]:
    # CuPy's memory pool hands out pieces of larger blocks, which hides overruns from memcheck:
    # the run turns the pool off (``pytest-no-pool``).
    return [_compute_sanitizer(), "--tool", tool, "--error-exitcode", "1", "--print-limit", "20",
            PY, SECTIONS_PY, "pytest-no-pool", "-q", "-p", "no:cacheprovider", "-x",
            *KERNEL_TESTS, "-k", "float32"]


def _cuda_tests() -> List[str]:
    # a module whose import fails (a package the GPU image lacks) loses only its own tests;
    # the notebooks have their own section (test_notebooks.py needs Jupyter)
    args = ["-m", "cuda and not mpi", "--continue-on-collection-errors", "--ignore",
            "tests/test_notebooks.py", "tests"]
    if importlib.util.find_spec("xdist") is not None:
        args = ["-n", "4", *args]  # the CPU side of 1000 small tests is the slow part
    return _pytest(*args)


def sections() -> List[Section]:
    """Every section in the order it runs."""
    part = [PY, SECTIONS_PY]
    no_sanitizer = ("compute-sanitizer needs a GPU; on the emulator the same kernels run under "
                    "ThreadSanitizer/AddressSanitizer in `make test-cuda-sanitize`")
    return [
        Section("env", "GPU, driver, CuPy, PyTorch and what the check needs", part + ["env"],
                part + ["env", "--dry-run"], 20, 20),
        Section("cupy-contract", "the backend's CuPy calls against real CuPy",
                _pytest("tests/backend_cuda/test_cupy_contract.py"),
                _pytest("tests/backend_cuda/test_cupy_contract.py", "-m", "not slow"), 45, 30),
        Section("cuda-tests", "every CUDA-marked test on the GPU", _cuda_tests(),
                _pytest("tests/backend_cuda/test_cuda_devices.py"), 150, 30),
        Section("notebook", "notebooks/hw3_cuda_kernels.ipynb, every code cell",
                [PY, "tools/run_notebook.py", "notebooks/hw3_cuda_kernels.ipynb"],
                [PY, "tools/run_notebook.py", "notebooks/hw3_cuda_kernels.ipynb"], 40, 45),
        Section("memcheck", "compute-sanitizer memcheck over the float32 kernel tests",
                _sanitizer("memcheck"), None, 50, 0, no_sanitizer),
        Section("racecheck", "compute-sanitizer racecheck over the float32 kernel tests",
                _sanitizer("racecheck"), None, 50, 0, no_sanitizer),
        Section("kernels", "kernel benchmarks beside PyTorch, against the card's peak",
                part + ["kernels"], part + ["kernels", "--dry-run"], 50, 30),
        Section("train-step", "one ResNet9 and one transformer LM step beside PyTorch eager",
                part + ["train-step"], part + ["train-step", "--dry-run"], 40, 30),
        Section("step-profile", "where a transformer LM step's time goes (cProfile by layer)",
                part + ["step-profile"], part + ["step-profile", "--dry-run"], 30, 30),
        Section("step-counts", "launches, CuPy calls, allocations, copies, synchronisations "
                "and Python calls per training step (read on the emulator: they are the GPU's)",
                part + ["step-counts"], part + ["step-counts", "--dry-run"], 60, 60),
        Section("graphs", "ResNet9 and the LM compiled as one CUDA graph per step: captured, "
                "equal to plain replay, timed beside PyTorch eager",
                part + ["graphs"], part + ["graphs", "--dry-run"], 90, 60),
        Section("emu-vs-gpu", "the emulator's results against the GPU's on the same inputs",
                part + ["emu-vs-gpu"], part + ["emu-vs-gpu", "--dry-run"], 35, 30),
    ]


def out_dir(given: Optional[str]) -> Path:
    """Where the report goes: --out, else $OUT, else build/gpu-check."""
    path = Path(given or os.environ.get("OUT") or ROOT / "build" / "gpu-check")
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_section(sec: Section, dry: bool, bound: float, out: Path) -> Dict[str, object]:
    """Run one section bounded in time; its status, seconds, output tail and figures."""
    cmd = sec.dry if dry else sec.gpu
    if cmd is None:
        return {"status": "skipped", "why": sec.why_not_dry, "seconds": 0.0}
    # figures in a scratch folder, so $OUT holds only the report's few files
    figures = Path(tempfile.gettempdir()) / f"gpu_check_{os.getpid()}_{sec.name}.json"
    figures.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        GPU_CHECK_FIGURES=str(figures), PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    if dry:
        env.setdefault("NEEDLE_CUDA_EMULATOR", "1")
    t0 = time.monotonic()
    try:
        status, text = _bounded(cmd, env, bound)
    except FileNotFoundError as e:  # compute-sanitizer missing, say
        status, text = "failed (not found)", str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    result: Dict[str, object] = {"status": status, "seconds": round(time.monotonic() - t0, 1),
                                 "command": " ".join(cmd), "summary": lines[-1] if lines else "",
                                 "tail": text[-3000:]}
    if figures.exists():
        result["figures"] = json.loads(figures.read_text())
        figures.unlink()
    return result


def _bounded(cmd: List[str], env: Dict[str, str], bound: float) -> Tuple[str, str]:
    """(status, output) of ``cmd`` run in a session of its own; past ``bound`` seconds the
    whole session (pytest's workers, the sanitizer's target) is killed."""
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return f"timeout ({bound:.0f} s)", out or ""
    return ("ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"), out or ""


def markdown(report: Dict[str, object]) -> str:
    """The report as Markdown: one table row per section, then each section's figures."""
    mode = report["mode"]
    lines = [f"# needle GPU check ({mode})", "",
             f"{report['started']} UTC, {report['seconds']} s in all. " + (
                 "**Dry run on the CUDA emulator: no figure here is a GPU figure.**"
                 if mode == "emulated" else ""), "",
             "| section | status | seconds | what |", "| --- | --- | --- | --- |"]
    secs: Dict[str, Dict] = report["sections"]  # type: ignore[assignment]
    for name, r in secs.items():
        lines.append(f"| {name} | {r['status']} | {r['seconds']} | {r['what']} |")
    for name, r in secs.items():
        lines += ["", f"## {name}", ""]
        if r.get("why"):
            lines.append(f"Skipped: {r['why']}")
        elif r.get("summary"):
            lines.append(f"`{r['summary']}`")
        for row in (r.get("figures") or {}).get("rows", []):
            lines.append("- " + ", ".join(f"{k}: {v}" for k, v in row.items()))
        if r["status"] != "ok" and r.get("tail"):
            lines += ["", "```", str(r["tail"])[-1500:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    """Run the sections within the budget; write report.md and report.json; 1 if any failed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="run every section on the CUDA emulator with tiny sizes")
    p.add_argument("--out", default=None, help="report folder (default $OUT or build/gpu-check)")
    p.add_argument("--only", default="", help="comma-separated section names")
    p.add_argument("--bound", action="append", default=[], metavar="SECTION=SECONDS",
                   help="override a section's time bound")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    args = p.parse_args(argv)
    out, start = out_dir(args.out), time.monotonic()
    chosen = [s for s in sections() if not args.only or s.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {s.name for s in sections()}
    if unknown:
        p.error(f"--only: no section {sorted(unknown)}; sections: "
                f"{[s.name for s in sections()]}")
    bounds = _bounds(p, args.bound)
    report: Dict[str, object] = {"mode": "emulated" if args.dry_run else "gpu",
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                                 "sections": {}}
    for sec in chosen:
        left = args.budget - (time.monotonic() - start)
        bound = min(bounds.get(sec.name, sec.dry_bound_s if args.dry_run else sec.bound_s),
                    max(left, 1.0))
        print(f"[gpu-check] {sec.name}: {sec.what} (bound {bound:.0f} s)", flush=True)
        res = run_section(sec, args.dry_run, bound, out) if left > 1 else {
            "status": "not run (budget spent)", "seconds": 0.0}
        res["what"] = sec.what
        report["sections"][sec.name] = res  # type: ignore[index]
        print(f"[gpu-check] {sec.name}: {res['status']} in {res['seconds']} s", flush=True)
        report["seconds"] = round(time.monotonic() - start, 1)
        _write(out, report)
    failed = [n for n, r in report["sections"].items()  # type: ignore[attr-defined]
              if r["status"] not in ("ok", "skipped")]
    print(f"[gpu-check] report: {out / 'report.md'}; "
          f"{'all sections ok' if not failed else 'not ok: ' + ', '.join(failed)}")
    return 1 if failed else 0


def _bounds(p: argparse.ArgumentParser, given: List[str]) -> Dict[str, float]:
    bounds = {}
    for item in given:
        name, _, secs = item.partition("=")
        try:
            bounds[name] = float(secs)
        except ValueError:
            p.error(f"--bound {item!r}: expected SECTION=SECONDS")
    return bounds


def _write(out: Path, report: Dict[str, object]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))


if __name__ == "__main__":
    sys.exit(main())
