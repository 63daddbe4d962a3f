"""apps.train_parallel --device cuda: every strategy, each of 2 ranks on its own (emulated)
GPU, gives the CPU run's loss at every step.

One ``mpiexec -n 2`` job runs every strategy twice (CPU, then CUDA) through the app's own
parser, device choice and strategy table, so the 2 ranks start once. Without a GPU the ranks
use the emulator's two devices (``NEEDLE_CUDA_EMULATOR_DEVICES=2``).
"""
import time

import numpy as np
import pytest
from mpi_helpers import run_ranks

import needle as ndl

MODEL = ["--steps", "2", "--batch", "4", "--seq-len", "8", "--d-model", "16", "--heads", "2",
         "--layers", "2", "--chars", "3000"]
DATA = ["--steps", "2", "--batch", "8"]
# strategy -> its options (the smallest model and the fewest steps: emulated kernels are slow);
# every strategy of the app (``test_runs_cover_every_strategy``)
RUNS = {"naive": DATA, "ddp": DATA, "zero1": DATA, "zero2": DATA, "fsdp": DATA, "ps": DATA,
        "tp": MODEL, "pp": MODEL + ["--microbatches", "2"],
        "moe": MODEL + ["--experts", "2"],
        "3d": MODEL + ["--dp", "1", "--pp", "2", "--tp", "1", "--microbatches", "2"]}
BOUND_S = 120  # the whole job


def run_every_strategy(comm, runs):
    """On each rank: {strategy: (device repr per kind, losses per kind, seconds)}."""
    from apps import train_parallel as tp
    out = {"allreduce": _device_allreduce(comm, tp.pick_device("cuda", comm))}
    for strategy, options in runs.items():
        got = {}
        start = time.perf_counter()
        for kind in ("cpu", "cuda"):
            p = tp.parser()
            args = tp.finish_args(p, p.parse_args(["--strategy", strategy, "--device", kind,
                                                   "--no-progress", *options]))
            args.device = tp.pick_device(args.device, comm)
            figures = tp.STRATEGIES[strategy](comm, args)
            # ps: this rank's own (seconds, loss) history (the server's is empty)
            losses = figures.get("losses") or [v for _, v in figures.get("history", [])]
            got[kind] = (repr(args.device), [float(v) for v in losses])
            comm.barrier()
        out[strategy] = (got, time.perf_counter() - start)
    return out


def _device_allreduce(comm, device):
    """A collective on a device tensor: staged through the host, the sum back on ``device``."""
    t = ndl.Tensor(np.full(5, comm.rank + 1.0, dtype=np.float32), device=device)
    got = comm.allreduce(t)
    return repr(got.device), got.numpy().tolist()


@pytest.mark.mpi
@pytest.mark.cuda
@pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU (NEEDLE_CUDA_EMULATOR=1 runs the "
                    "emulator instead)")
def test_every_strategy_on_cuda_matches_cpu_step_by_step():
    ranks = run_ranks("mpi", 2, run_every_strategy, RUNS, timeout=BOUND_S,
                      env={"NEEDLE_CUDA_EMULATOR_DEVICES": "2", "OMP_NUM_THREADS": "1"})
    for rank, result in enumerate(ranks):
        dev, summed = result.pop("allreduce")
        assert dev.startswith(f"cuda({rank}") and summed == [3.0] * 5, (rank, dev, summed)
        assert sorted(result) == sorted(RUNS)
        for strategy, (got, _secs) in result.items():
            cpu_dev, cpu_losses = got["cpu"]
            cuda_dev, cuda_losses = got["cuda"]
            assert cpu_dev == "cpu()"
            assert cuda_dev.startswith(f"cuda({rank}"), (strategy, rank, cuda_dev)
            if strategy == "ps" and rank == 0:
                continue  # the server trains nothing
            assert len(cuda_losses) == len(cpu_losses) > 0, (strategy, rank)
            np.testing.assert_allclose(cuda_losses, cpu_losses, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{strategy} on rank {rank}")


def test_runs_cover_every_strategy():
    from apps import train_parallel as tp
    assert sorted(RUNS) == sorted(tp.STRATEGIES)


@pytest.mark.parametrize("strategy", sorted(RUNS))
def test_every_strategy_takes_device_cuda(strategy):
    from apps import train_parallel as tp
    p = tp.parser()
    args = tp.finish_args(p, p.parse_args(["--strategy", strategy, "--device", "cuda"]))
    assert args.device == "cuda"
