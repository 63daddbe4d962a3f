"""The sanitizer check: it passes on the real kernels and fails on mutants.

A kernel copy with one ``__syncthreads()`` removed must make ThreadSanitizer report a data
race (the fiber engine only returns wrong sums, silently), and
a copy with an off-by-one loop bound must make AddressSanitizer report a heap overflow. The
unmutated kernels run clean under both; ``make test-cuda-sanitize`` runs the whole kernel test
file that way. Every child process has a wall-clock bound.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from needle.backend_cuda import kernel_specs as K
from needle.backend_cuda.emulator import build
from tools import sanitize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CHILD_TIMEOUT = 600

REDUCE_BARRIER = "    if (lane == 0) smem[warp] = acc;\n    __syncthreads();\n"
COMPACT_STORE = "    out[i] = a[ndl::strided_index(i, ndim, s_shape, s_strides, offset)];"
UNARY_BOUND = ("  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride())\n"
               "    out[i] = ndl::from_acc<T>(op(ndl::to_acc(a[i])));")


def mutated(filename: str, old: str, new: str) -> str:
    """kernels/<filename> with exactly one occurrence of ``old`` replaced."""
    src = K.source(filename)
    assert src.count(old) == 1, f"the mutation site moved in {filename}"
    return src.replace(old, new)


def run_planted(mode: str, filename: str, code: str, select: str, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess:
    """The kernel tests matching ``select`` under ``mode``, as make test-cuda-sanitize runs
    them, with kernels/<filename> replaced by ``code`` (a copy of kernels/ in tmp_path)."""
    if build.find_runtime(mode) is None:
        pytest.skip(f"gcc's {mode} sanitizer runtime is not installed")
    kernels = tmp_path / "kernels"
    shutil.copytree(K.KERNEL_DIR, kernels)
    (kernels / filename).write_text(code)
    (tmp_path / "planted_kernels.py").write_text(  # a plugin: the child loads these kernels
        "from pathlib import Path\nfrom needle.backend_cuda import kernel_specs\n"
        f"kernel_specs.KERNEL_DIR = Path({str(kernels)!r})\n")
    monkeypatch.setenv("NEEDLE_CUDA_EMULATOR_CACHE", str(tmp_path / "cache"))  # no leftovers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    return sanitize.run_pytest(mode, ["-p", "planted_kernels", sanitize.DEFAULT_TESTS[0],
                                      "-k", select], timeout=CHILD_TIMEOUT, cwd=str(ROOT))


def run_child(mode: str, case: str, code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    if build.find_runtime(mode) is None:
        pytest.skip(f"gcc's {mode} sanitizer runtime is not installed")
    src = tmp_path / f"{case}.cu"
    src.write_text(code)
    return subprocess.run([sys.executable, str(HERE / "sanitize_worker.py"), case, str(src)],
                          env=sanitize.sanitizer_env(mode), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, cwd=ROOT)


def test_tsan_passes_reduce_and_flags_a_removed_syncthreads(tmp_path):
    clean = run_child("thread", "reduce", K.source("reduce.cu"), tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    code = mutated("reduce.cu", REDUCE_BARRIER, "    if (lane == 0) smem[warp] = acc;\n")
    res = run_child("thread", "reduce", code, tmp_path)
    assert res.returncode == sanitize.SANITIZER_EXIT, res.stdout + res.stderr[-3000:]
    assert "ThreadSanitizer: data race" in res.stderr and "reduce_rows_block" in res.stderr
    # the report points at the mutated file's lines and names CUDA blocks and threads
    lines = code.splitlines()
    write = lines.index("    if (lane == 0) smem[warp] = acc;") + 1
    assert f"{tmp_path / 'reduce.cu'}:{write}" in res.stderr, res.stderr[-3000:]
    assert "'B0 T" in res.stderr or "'B1 T" in res.stderr, res.stderr[-3000:]


@pytest.mark.slow
def test_tsan_names_both_lines_of_a_race_after_other_kernels(tmp_path, monkeypatch):
    """The whole kernel test file's condition: strided.cu's tests run first in the same pytest
    process, then a reduction without its barrier. Both accesses carry file:line (gcc's
    symbolizer sees only the libraries loaded when it first symbolizes: build.SANITIZE_FLAGS)."""
    code = mutated("reduce.cu", REDUCE_BARRIER, "    if (lane == 0) smem[warp] = acc;\n")
    res = run_planted("thread", "reduce.cu", code,
                      "test_strided_copies or (test_reduce_launches and sum)", tmp_path,
                      monkeypatch)
    assert res.returncode == sanitize.SANITIZER_EXIT, res.stdout[-3000:] + res.stderr[-3000:]
    lines = code.splitlines()
    write = lines.index("    if (lane == 0) smem[warp] = acc;") + 1
    read = next(i for i, line in enumerate(lines, 1) if "smem[lane]" in line)
    report = res.stderr[res.stderr.index("WARNING: ThreadSanitizer: data race"):]
    # the first frame of each access, the write and the read in whichever order they ran
    frames = re.findall(r"(?:[Ww]rite|[Rr]ead) of size \d+ .*\n +#0 (.*)", report)[:2]
    assert len(frames) == 2 and all("reduce_rows_block" in f for f in frames), report[:3000]
    where = re.escape(str(tmp_path / "kernels" / "reduce.cu"))
    named = sorted(int(m.group(1)) for f in frames if (m := re.search(rf" {where}:(\d+) ", f)))
    assert named == sorted([write, read]), report[:3000]


def test_tsan_sees_a_race_between_blocks(tmp_path):
    """Blocks of a kernel without __shared__ memory run side by side on the thread engine, so a
    missing atomic between blocks is a data race between threads of two blocks."""
    code = ("__global__ void count_blocks(float* out) {\n"
            "  if (threadIdx.x == 0) out[0] += 1.0f;  // needs atomicAdd\n"
            "}\n")
    res = run_child("thread", "blocks", code, tmp_path)
    assert res.returncode == sanitize.SANITIZER_EXIT, res.stdout + res.stderr[-3000:]
    assert "ThreadSanitizer: data race" in res.stderr
    assert f"{tmp_path / 'blocks.cu'}:2" in res.stderr
    assert len(set(re.findall(r"'B(\d+) T0'", res.stderr))) >= 2, res.stderr[-3000:]


def test_asan_passes_ewise_and_flags_an_off_by_one(tmp_path):
    clean = run_child("address", "unary", K.source("ewise.cu"), tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    code = mutated("ewise.cu", UNARY_BOUND, UNARY_BOUND.replace("i < n", "i <= n"))
    res = run_child("address", "unary", code, tmp_path)
    assert res.returncode == sanitize.SANITIZER_EXIT, res.stdout + res.stderr[-3000:]
    assert "AddressSanitizer: heap-buffer-overflow" in res.stderr
    assert "ewise_unary" in res.stderr
    assert f"{tmp_path / 'unary.cu'}:" in res.stderr, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["thread", "address"])
def test_sanitizer_pass_over_the_float32_kernels(mode):
    """What CI runs through ``make test``: the float32 tests of every kernel whose threads
    share memory (reduce, softmax, layernorm, tiled matmul, strided) under the sanitizer;
    ``make test-cuda-sanitize`` runs every kernel test of every dtype."""
    if build.find_runtime(mode) is None:
        pytest.skip(f"gcc's {mode} sanitizer runtime is not installed")
    select = "float32 and (reduce or softmax or logsumexp or layernorm or tiled) or strided"
    res = sanitize.run_pytest(mode, ["tests/backend_cuda/emulator/test_emu_kernels.py",
                                     "-k", select], timeout=CHILD_TIMEOUT, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]


def test_asan_calls_a_write_far_past_the_end_an_overflow(tmp_path, monkeypatch):
    """compact writing 40 elements past a 60-byte buffer lands beyond ASan's default redzone,
    in a neighbouring freed allocation (reported as a "heap-use-after-free" of it):
    sanitize.ASAN_REDZONE keeps it a heap-buffer-overflow of the kernel's buffer."""
    code = mutated("strided.cu", COMPACT_STORE, COMPACT_STORE.replace("out[i]", "out[i + n + 40]"))
    res = run_planted("address", "strided.cu", code, "test_strided_copies", tmp_path,
                      monkeypatch)
    assert res.returncode == sanitize.SANITIZER_EXIT, res.stdout[-3000:] + res.stderr[-3000:]
    assert "AddressSanitizer: heap-buffer-overflow" in res.stderr, res.stderr[-3000:]
    # the kernel's own buffer (width 1, first view: 60 bytes), at least 40 bytes past its end;
    # the default redzone named a neighbour instead ("2 bytes to the right", "inside of")
    where = re.search(r"located (\d+) bytes to the right of 60-byte region", res.stderr)
    assert where and int(where.group(1)) >= 40, res.stderr[-3000:]
    assert f"{tmp_path / 'kernels' / 'strided.cu'}:" in res.stderr, res.stderr[-3000:]


def test_command_line_splits_test_paths_from_pytest_args():
    """``--mode thread -- -k float32``: -k float32 goes to pytest over the default tests."""
    assert sanitize.split_args(["--mode", "thread", "--", "-k", "float32"]) == \
        (["--mode", "thread"], ["-k", "float32"])
    assert sanitize.split_args(["t.py::x"]) == (["t.py::x"], [])


def test_a_report_is_printed_in_full(tmp_path, capsys, monkeypatch):
    """A sanitizer report raised inside a pytest child (which captures stderr) reaches the
    caller through the sanitizer's log file."""
    if build.find_runtime("address") is None:
        pytest.skip("gcc's address sanitizer runtime is not installed")
    code = mutated("ewise.cu", UNARY_BOUND, UNARY_BOUND.replace("i < n", "i <= n"))
    (tmp_path / "unary.cu").write_text(code)
    (tmp_path / "test_child.py").write_text(
        "import subprocess, sys\n"
        "def test_child():\n"
        f"    sys.argv = ['w', 'unary', {str(tmp_path / 'unary.cu')!r}]\n"
        f"    exec(open({str(HERE / 'sanitize_worker.py')!r}).read(), "
        "{'__name__': '__main__'})\n")
    status = sanitize.main(["--mode", "address", str(tmp_path / "test_child.py")])
    err = capsys.readouterr().err
    assert status == 1
    assert "AddressSanitizer: heap-buffer-overflow" in err and f"{tmp_path / 'unary.cu'}:" in err
