"""Where it is trained: nodes x GPUs per node, memory, peak FLOP/s, and the links' alpha and beta:
datasheet presets, or ``measure_here`` (its workers in ``measure/``)."""
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from ..parallel import mpiexec
from ..parallel.comm.algorithms.cost_model import ALPHA, BETA
from .core_sharing import sharing_factor, slowdown_curve

__all__ = ["ClusterSpec", "PRESETS", "preset", "measure_gemm_flops", "measure_here"]


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster; bandwidths as beta (seconds per byte), latencies as alpha."""

    nodes: int
    gpus_per_node: int
    gpu_memory: float                    # bytes per GPU
    peak_flops: Dict[str, float]         # per dtype: "fp32", "mixed"
    intra_alpha: float
    intra_beta: float
    inter_alpha: float
    inter_beta: float
    efficiency: float = 0.6              # achieved / peak FLOP/s for the model's GEMMs
    host_beta: float = 1 / 25e9          # CPU <-> GPU (PCIe 4 x16), for offload
    host_adam_rate: float = 1e9          # parameters per second a CPU Adam updates (offload)
    overlap: bool = True                 # data-parallel comm can hide behind backward
    name: str = "custom"

    @property
    def gpus(self) -> int:
        """Every GPU of the cluster."""
        return self.nodes * self.gpus_per_node

    def check(self) -> "ClusterSpec":
        """Raise ValueError naming the field when a size is zero or negative."""
        for name in ("nodes", "gpus_per_node"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("gpu_memory", "intra_beta", "inter_beta", "efficiency"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.efficiency > 1:
            raise ValueError(f"efficiency is achieved / peak FLOP/s, at most 1, got "
                             f"{self.efficiency!r}")
        if not all(v > 0 for v in self.peak_flops.values()):
            raise ValueError(f"peak_flops must be > 0 per dtype, got {self.peak_flops}")
        return self


PRESETS: Dict[str, ClusterSpec] = {
    "dgx-a100-80g": ClusterSpec(1, 8, 80e9, {"mixed": 312e12, "fp32": 19.5e12},
                                5e-6, 1 / 300e9, 10e-6, 1 / 25e9, name="dgx-a100-80g"),
    "dgx-a100-40g": ClusterSpec(1, 8, 40e9, {"mixed": 312e12, "fp32": 19.5e12},
                                5e-6, 1 / 300e9, 10e-6, 1 / 25e9, name="dgx-a100-40g"),
    "dgx-h100": ClusterSpec(1, 8, 80e9, {"mixed": 989e12, "fp32": 67e12},
                            4e-6, 1 / 450e9, 8e-6, 1 / 50e9, host_beta=1 / 50e9,
                            name="dgx-h100"),
}


def preset(name: str, **overrides: Any) -> ClusterSpec:
    """A named cluster, optionally with fields replaced (``nodes=384``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; choose one of "
                         f"{', '.join(PRESETS)} or 'here'")
    return replace(PRESETS[name], **overrides).check()


def measure_gemm_flops(n: int = 256, dtype: str = "float32", seconds: float = 0.3) -> float:
    """Achieved FLOP/s of an n x n x n numpy matmul (the best of repeated runs)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.copy()
    best, end = np.inf, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


SITE = Path(__file__).resolve().parents[2]  # the folder holding this needle/: clone or install


def _run_json(worker: str, ranks: int, timeout: float, threads: int = 0) -> Any:
    """Run ``python -m needle.plan.measure.<worker> out.json`` under ``mpiexec -n ranks``
    (``threads``: BLAS/OpenMP threads per rank, 0 for needle's choice); the JSON it wrote."""
    env = mpiexec.pythonpath_env(SITE)
    if threads:
        env.update(dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                  "MKL_NUM_THREADS"), str(threads)))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fit.json")
        cmd = mpiexec.python_command(ranks, "-m", f"needle.plan.measure.{worker}", out)
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True, env=env,
                       cwd=SITE)  # this needle, whatever the caller's folder holds
        with open(out) as f:
            return json.load(f)


def measure_alpha_beta(ranks: int, timeout: float = 60.0) -> Dict[str, float]:
    """alpha, beta of MPI messages and the per-rank GEMM FLOP/s of ``ranks`` processes."""
    return _run_json("pingpong", ranks, timeout)


def measure_core_sharing(ranks: int, threads: int = 1, timeout: float = 120.0
                         ) -> List[Tuple[float, float]]:
    """``core_sharing``'s (w, factor) pairs at ``ranks`` ranks (the one-rank run with ``threads``
    BLAS threads, as each rank gets)."""
    one = _run_json("core_sharing", 1, timeout, threads)["seconds"]
    many = _run_json("core_sharing", ranks, timeout)["seconds"]
    return slowdown_curve(one, many)


def measure_here(ranks: int = 2, mpi: bool = True) -> ClusterSpec:
    """This machine as a one-node cluster of ``ranks`` CPU ranks, measured now: peak FLOP/s the
    measured GEMM rate, no overlap (ranks share the cores), efficiency 1 / the measured slowdown
    of synchronised work when ranks outnumber cores (``core_sharing``)."""
    flops = measure_gemm_flops()
    ab = measure_alpha_beta(ranks) if mpi and ranks > 1 else {"alpha": ALPHA, "beta": BETA}
    flops = min(flops, ab.get("gemm_flops", flops))  # per rank, with every rank running
    shared = mpi and ranks > len(os.sched_getaffinity(0))
    factor = sharing_factor(measure_core_sharing(ranks)) if shared else 1.0
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(ranks, 1)
    return ClusterSpec(1, ranks, float(mem), {"fp32": flops, "mixed": flops},
                       ab["alpha"], ab["beta"], ab["alpha"], ab["beta"], efficiency=1.0 / factor,
                       host_beta=ab["beta"], overlap=False, name=f"here (x{ranks})")
