"""Checkpoints that change the tensor-parallel layout: save at tp=p, load at any tp=q, gathered
(the serial layout) or sharded with an index (``manifest.py``), one full weight at a time."""
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ...nn.nn_module import Module
from ...serialization import CheckpointError, save
from .. import manifest
from ..comm.protocol import Comm
from .tp_comms import allgather_axis

__all__ = ["shard_axes", "gather_state_dict", "load_full_state_dict", "save_sharded",
           "load_sharded"]


def shard_axes(module: Module) -> Dict[str, Optional[int]]:
    """Parameter name -> the axis of the full weight it is a slice of (None: replicated)."""
    return {n: getattr(p, "tp_axis", None) for n, p in module.named_parameters()}


def _slice(full: np.ndarray, axis: Optional[int], rank: int, size: int) -> np.ndarray:
    if axis is None:
        return full
    if full.shape[axis] % size:
        raise ValueError(f"a weight of shape {full.shape} does not split into {size} equal "
                         f"parts along axis {axis}")
    return np.array_split(full, size, axis=axis)[rank]


def gather_state_dict(module: Module, comm: Comm) -> Dict[str, np.ndarray]:
    """The module's state in the serial layout (every shard all-gathered), on every rank."""
    axes, out = shard_axes(module), module.state_dict()
    for name, value in out.items():
        axis = axes.get(name)
        if axis is not None and comm.size > 1:
            out[name] = allgather_axis(comm, value, axis)
    return out


def load_full_state_dict(module: Module, comm: Comm, state: Dict[str, Any]) -> None:
    """Load a serial-layout state into this rank's shards."""
    axes = shard_axes(module)
    mine = {n: _slice(np.asarray(v), axes.get(n), comm.rank, comm.size) for n, v in state.items()}
    module.load_state_dict(mine)


KIND = manifest.Kind("needle-tp-1", "tp", "tp", lambda r, n: f"shard{r}.ndl", keys=("axes",))


def save_sharded(module: Module, comm: Comm, directory: str) -> None:
    """Each rank writes its shard; rank 0 writes the index (tp size, axis of each name)."""
    os.makedirs(directory, exist_ok=True)
    save(module.state_dict(), os.path.join(directory, KIND.file_name(comm.rank, comm.size)))
    axes = {n: (-1 if a is None else a) for n, a in shard_axes(module).items()}
    manifest.write(comm, directory, "index.json", KIND, [], {"axes": axes})


def load_sharded(module: Module, comm: Comm, directory: str) -> None:
    """Load a ``save_sharded`` checkpoint of any tp into this rank's shards (pp, dp must be 1)."""
    who = f"load_sharded (tensor parallel, rank {comm.rank})"
    index = manifest.read(directory, "index.json", KIND, who, {"pp": 1, "dp": 1})
    fail = manifest.failer(who, os.path.join(directory, "index.json"))
    shards = [manifest.load(directory, entry, who) for entry in index["files"]]
    mine = {n: (-1 if a is None else a) for n, a in shard_axes(module).items()}
    if index["axes"] != mine:  # the layers declare their axes, the same at any tp
        raise fail(f"its axes {str(index['axes'])[:200]} are not this model's {mine}")
    load_full_state_dict(module, comm, _merge(shards, index["axes"], fail))


def _merge(shards: List[Any], axes: Any, fail: Callable[[str], CheckpointError]
           ) -> Dict[str, np.ndarray]:
    """The full weights from the old shards (``axes`` already checked against the model's)."""
    if not all(isinstance(s, dict) and list(s) == list(shards[0]) for s in shards):
        raise fail("its shards do not hold the same parameter names")
    if not isinstance(axes, dict) or sorted(axes) != sorted(shards[0]):
        raise fail(f"its axes name {sorted(axes)[:8] if isinstance(axes, dict) else axes!r:.80}, "
                   f"its shards {sorted(shards[0])[:8]}")
    state = {}
    for name in shards[0]:
        parts, axis = [np.asarray(s[name]) for s in shards], axes[name]
        try:
            state[name] = parts[0] if axis < 0 else np.concatenate(parts, axis=axis)
        except ValueError as err:
            raise fail(f"the shards of {name!r} do not fit together: {err}") from None
    return state
