"""Split an ``nn.Sequential`` into contiguous pipeline stages of balanced cost (GPipe, sec.
2.2: the slowest stage sets the pace), exactly by dynamic programming."""
import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ...nn.nn_basic import Sequential
from ...nn.nn_module import Module

__all__ = ["balanced_cuts", "partition", "param_costs", "time_costs"]


def param_costs(layers: Sequence[Module]) -> List[float]:
    """Number of parameter entries of each layer."""
    return [float(sum(int(np.prod(p.shape)) for p in layer.parameters())) for layer in layers]


def time_costs(layers: Sequence[Module], example: Any, repeats: int = 3) -> List[float]:
    """Seconds each layer takes on ``example`` fed through the layers in order (best of n)."""
    costs, x = [], example
    for layer in layers:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            y = layer(x)
            y.realize_cached_data()
            best = min(best, time.perf_counter() - start)
        costs.append(best)
        x = y.detach()
    return costs


def balanced_cuts(costs: Sequence[float], num_stages: int) -> List[int]:
    """Stage boundaries [0, c1, ..., len(costs)] minimizing the most expensive stage."""
    n = len(costs)
    if num_stages > n:
        raise ValueError(f"cannot split {n} layers into {num_stages} pipeline stages "
                         f"(more stages than layers)")
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    # best[k][i]: smallest max-stage-cost splitting the first i layers into k stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(best[k - 1][j], prefix[i] - prefix[j])
                if c < best[k][i]:
                    best[k][i], cut[k][i] = c, j
    bounds, i = [n], n
    for k in range(num_stages, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]


def partition(model: Sequential, num_stages: int, by: str = "params", example: Any = None,
              costs: Optional[Callable[[Sequence[Module]], List[float]]] = None
              ) -> List[Sequential]:
    """``num_stages`` Sequentials of consecutive layers of ``model``, balanced by cost."""
    layers = list(model)
    if costs is not None:
        c = costs(layers)
    elif by == "params":
        c = param_costs(layers)
    elif by == "time":
        if example is None:
            raise ValueError("partition(by='time') needs an example input")
        c = time_costs(layers, example)
    else:
        raise ValueError(f"partition: by must be 'params' or 'time', got {by!r}")
    bounds = balanced_cuts(c, num_stages)
    return [Sequential(*layers[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
