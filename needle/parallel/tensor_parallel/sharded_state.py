"""Checkpoints that change the tensor-parallel layout: save at tp=p, load at any tp=q.

Each sharded parameter knows which axis of the full (serial) weight it slices (``tp_axis``, set
by the layers); replicated ones have none. Two formats, both written with ``ndl.save``:

* gathered: ``gather_state_dict`` all-gathers every shard into the serial layout (one file, as
  a tp=1 model would write it); ``load_full_state_dict`` slices it for any tp;
* per-shard with an index: ``save_sharded`` writes ``shard<r>.ndl`` per rank, then rank 0
  writes ``index.json`` last (``manifest.py``: the old tp size, each parameter's axis, each
  shard's checksum); ``load_sharded`` reads only the shards it names, checksums checked,
  rebuilds each full weight from the old shards and keeps this rank's slice of the new layout.
  No rank ever needs more memory than one full parameter at a time.
"""
import os
from typing import Any, Dict, Optional

import numpy as np

from ...nn.nn_module import Module
from ...serialization import save
from .. import manifest
from ..comm.protocol import Comm

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
    out = {}
    axes = shard_axes(module)
    for name, value in module.state_dict().items():
        axis = axes.get(name)
        if axis is None or comm.size == 1:
            out[name] = value
        else:
            moved = np.ascontiguousarray(np.moveaxis(value, axis, 0))
            out[name] = np.moveaxis(comm.allgather(moved), 0, axis)
    return out


def load_full_state_dict(module: Module, comm: Comm, state: Dict[str, Any]) -> None:
    """Load a serial-layout state into this rank's shards."""
    axes = shard_axes(module)
    mine = {n: _slice(np.asarray(v), axes.get(n), comm.rank, comm.size) for n, v in state.items()}
    module.load_state_dict(mine)


def save_sharded(module: Module, comm: Comm, directory: str) -> None:
    """Each rank writes its shard; rank 0 writes the index (tp size, axis of each name)."""
    os.makedirs(directory, exist_ok=True)
    mine = f"shard{comm.rank}.ndl"
    save(module.state_dict(), os.path.join(directory, mine))
    axes = {n: (-1 if a is None else a) for n, a in shard_axes(module).items()}
    manifest.write(comm, directory, "index.json", mine, [],
                   {"format": "needle-tp-1", "tp": comm.size, "axes": axes})


def load_sharded(module: Module, comm: Comm, directory: str) -> None:
    """Load a ``save_sharded`` checkpoint written at any tp into this rank's new shards."""
    who = f"load_sharded (tensor parallel, rank {comm.rank})"
    index = manifest.read(directory, "index.json", who, ("tp", "axes"))
    axes = index["axes"]
    shards = [manifest.load(directory, entry, who) for entry in index["files"]]
    state = {}
    for name in shards[0]:
        axis = int(axes[name])
        full = (np.asarray(shards[0][name]) if axis < 0 else
                np.concatenate([np.asarray(s[name]) for s in shards], axis=axis))
        state[name] = full
    load_full_state_dict(module, comm, state)
