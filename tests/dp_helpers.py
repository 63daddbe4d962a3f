"""Models, data and single-process references shared by the data-parallel tests.

Every data-parallel strategy is checked the same way: N ranks, each seeded differently (so that
only the broadcast from rank 0 can make them agree), each training on its slice of one fixed
batch, must match one process training on the whole batch at every step (float64).
"""
from typing import Callable, List, Sequence

import numpy as np
import pytest

import needle as ndl
from needle import nn

BATCH, DIM, HIDDEN, CLASSES = 12, 5, 8, 3
SEED = 10  # rank r builds its model from SEED + r; the reference from SEED (rank 0's)


def backends() -> list:
    """Virtual and MPI once the virtual cluster exists; MPI alone until then."""
    from mpi_helpers import BACKENDS
    try:
        import needle.parallel.virtual  # noqa: F401
    except ImportError:
        return [pytest.param("mpi", marks=pytest.mark.mpi)]
    return BACKENDS


def virtual_only() -> list:
    """The in-process cluster (falls back to MPI while it does not exist)."""
    return [b for b in backends() if b == "virtual"] or backends()


def fast_backend() -> str:
    """"virtual" when the in-process cluster exists, else "mpi"."""
    return "virtual" if virtual_only() == ["virtual"] else "mpi"


class TiedMLP(nn.Module):
    """An MLP with a frozen parameter and one weight used by two layers (tied)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, HIDDEN, dtype="float64")
        self.mid = nn.Linear(HIDDEN, HIDDEN, dtype="float64")
        self.mid2 = nn.Linear(HIDDEN, HIDDEN, dtype="float64")
        self.mid2.weight = self.mid.weight  # tied: one parameter, two uses
        self.out = nn.Linear(HIDDEN, CLASSES, dtype="float64")
        self.scale = nn.Parameter(np.full((1, HIDDEN), 0.5), dtype="float64")
        self.scale.requires_grad = False  # frozen
        self.unused = nn.Parameter(np.ones((2, 2)), dtype="float64")  # never in the graph

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        h = ndl.ops.relu(self.inp(x))
        h = ndl.ops.tanh(self.mid(h)) * self.scale.broadcast_to((x.shape[0], HIDDEN))
        h = ndl.ops.relu(self.mid2(h))
        return self.out(h)


def mlp(depth: int = 2) -> nn.Module:
    """A plain float64 MLP of ``depth`` hidden layers."""
    layers: List[nn.Module] = [nn.Linear(DIM, HIDDEN, dtype="float64"), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(HIDDEN, HIDDEN, dtype="float64"), nn.ReLU()]
    layers.append(nn.Linear(HIDDEN, CLASSES, dtype="float64"))
    return nn.Sequential(*layers)


MODELS = {"mlp": mlp, "tied": TiedMLP, "deep": lambda: mlp(4)}


def build(name: str, seed: int) -> nn.Module:
    """Model ``name`` initialised from ``seed``."""
    np.random.seed(seed)
    return MODELS[name]()


def batch(step: int = 0):
    """The fixed global batch of a step: (X, y) numpy arrays."""
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((BATCH, DIM)), rng.integers(0, CLASSES, BATCH)


def local_slice(rank: int, size: int, step: int = 0):
    """Rank ``rank``'s contiguous slice of the step's batch, as Tensors."""
    X, y = batch(step)
    b = BATCH // size
    sl = slice(rank * b, (rank + 1) * b)
    return (ndl.Tensor(X[sl], dtype="float64", requires_grad=False),
            ndl.Tensor(y[sl], dtype="int64", requires_grad=False))


def whole_batch(step: int = 0):
    X, y = batch(step)
    return (ndl.Tensor(X, dtype="float64", requires_grad=False),
            ndl.Tensor(y, dtype="int64", requires_grad=False))


OPTIMIZERS = {
    "sgd": lambda params: ndl.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda params: ndl.optim.Adam(params, lr=0.01, weight_decay=0.01),
}


def loss_of(model: Callable, x: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
    return nn.SoftmaxLoss()(model(x), y)


def backward_that_raises(model: Callable, rank: int, size: int) -> None:
    """A backward of step 0's loss that raises half way: a hook on the input, which comes after
    every parameter's gradient (their hooks ran; the end-of-backward callback did not)."""
    x, y = local_slice(rank, size, 0)
    x = ndl.Tensor(x.numpy(), dtype="float64", requires_grad=True)

    def fail(_):
        raise RuntimeError("backward interrupted")
    x.register_hook(fail)
    with pytest.raises(RuntimeError, match="backward interrupted"):
        loss_of(model, x, y).backward()


def reference(model_name: str, opt_name: str, steps: int = 5) -> List[List[np.ndarray]]:
    """Single process, whole batch: the parameters after each step."""
    model = build(model_name, SEED)
    opt = OPTIMIZERS[opt_name](model.parameters())
    history = []
    for step in range(steps):
        loss = loss_of(model, *whole_batch(step))
        opt.reset_grad()
        loss.backward()
        opt.step()
        history.append(snapshot(model))
    return history


def snapshot(model: nn.Module) -> List[np.ndarray]:
    """Copies of the state dict's arrays, in state-dict order."""
    return [v.copy() for v in model.state_dict().values()]


def assert_histories_equal(got: Sequence[Sequence[np.ndarray]],
                           want: Sequence[Sequence[np.ndarray]], tol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for step, (g_step, w_step) in enumerate(zip(got, want)):
        for g, w in zip(g_step, w_step):
            np.testing.assert_allclose(g, w, rtol=0, atol=tol, err_msg=f"step {step}")


def fsdp_save_or_load(comm, directory: str, save: bool):
    """A small FSDP model (seed 4) saved to or loaded from ``directory``: None, or the
    ValueError / OSError it raised as "Type: message" (a rank's result for run_ranks)."""
    from needle.parallel import FullyShardedDataParallel
    np.random.seed(4)
    fsdp = FullyShardedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), comm)
    try:
        fsdp.save_sharded(directory) if save else fsdp.load_sharded(directory)
    except (ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return None
