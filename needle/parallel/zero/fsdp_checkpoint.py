"""FSDP checkpoints: a full state dict any plain model loads, and sharded per-rank files with an
index (``manifest.py``) that reload on the same world size."""
import os
from typing import Any, Callable, Dict, List

import numpy as np

from ... import serialization
from .. import manifest
from ..inputs import host_array

__all__ = ["full_state_dict", "load_full_state_dict", "save_sharded", "load_sharded"]


def _whole_tensors(fsdp: Any) -> Dict[str, Any]:
    """Frozen parameters and buffers by name: not sharded, the same on every rank."""
    out = {n: p for n, p in fsdp.module.named_parameters() if not p.requires_grad}
    out.update(fsdp.module.named_buffers())
    return out


def full_state_dict(fsdp: Any) -> Dict[str, np.ndarray]:
    """name -> array for the whole model, in the plain model's state_dict order."""
    values: Dict[str, np.ndarray] = {}
    for unit in fsdp.units:
        values.update(unit.unflatten(unit.full_flat()))
        if not unit.gathered:
            unit._storage = None
    values.update({n: t.numpy() for n, t in _whole_tensors(fsdp).items()})
    order = list(dict(fsdp.module.named_parameters())) + list(dict(fsdp.module.named_buffers()))
    return {k: values[k] for k in order}


def load_full_state_dict(fsdp: Any, state: Dict[str, Any], strict: bool = True) -> Any:
    """Take this rank's shards of a full (plain model) state dict."""
    from ...nn.nn_module import LoadResult
    names = [n for u in fsdp.units for n in u.names] + list(_whole_tensors(fsdp))
    missing = [k for k in names if k not in state]
    unexpected = [k for k in state if k not in names]
    if strict and (missing or unexpected):
        raise ValueError(f"FullyShardedDataParallel.load_state_dict (rank {fsdp.comm.rank}): "
                         f"missing keys {missing}, unexpected keys {unexpected}")
    for unit in fsdp.units:
        unit.load_flat({n: host_array(state[n]) for n in unit.names})
    whole = {k: v for k, v in state.items() if k in _whole_tensors(fsdp)}
    if whole:
        fsdp.module.load_state_dict(whole, strict=False)
    return LoadResult(missing, unexpected)


def _index(fsdp: Any) -> Dict[str, Any]:
    return {"world_size": fsdp.comm.size, "format": "needle-fsdp-1",
            "units": [{"name": u.name, "numel": u.numel, "cols": u.cols,
                       "params": [[n, list(s)] for n, s in zip(u.names, u.shapes)]}
                      for u in fsdp.units]}


def _shard_file(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.ndl"


KIND = manifest.Kind("needle-fsdp-1", "dp", "world_size", _shard_file, keys=("units",))


def save_sharded(fsdp: Any, directory: str, optimizer: Any = None) -> None:
    """Rank r writes its shards (+ optimizer state); rank 0 the index and the whole tensors."""
    comm = fsdp.comm
    os.makedirs(directory, exist_ok=True)
    payload: Dict[str, Any] = {"units": [u.shard.numpy() for u in fsdp.units]}
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if comm.rank == 0:
        payload["whole"] = {n: t.numpy() for n, t in _whole_tensors(fsdp).items()}
    mine = _shard_file(comm.rank, comm.size)
    serialization.save(payload, os.path.join(directory, mine))
    # the index last, once every shard is written; nobody reads before it exists
    manifest.write(comm, directory, "index.json", KIND, [], _index(fsdp))


def _check_units(got: Any, want: List[Dict[str, Any]],
                 fail: Callable[[str], serialization.CheckpointError]) -> None:
    """The index's units (names, sizes, parameters and shapes) are this model's, unit by unit."""
    if not isinstance(got, list) or len(got) != len(want):
        raise fail(f"{len(got) if isinstance(got, list) else 'no list of'} units, this model has "
                   f"{len(want)} ({[u['name'] for u in want]})")
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise fail(f"unit {i} is {str(g)[:200]}, this model's is {w}")


def load_sharded(fsdp: Any, directory: str, optimizer: Any = None) -> None:
    """Reload ``save_sharded``'s files; the job size and the units must match the index."""
    comm = fsdp.comm
    who = f"load_sharded (rank {comm.rank})"
    index = manifest.read(directory, "index.json", KIND, who, {"tp": 1, "pp": 1})
    if index["world_size"] != comm.size:
        raise serialization.CheckpointError(
            f"load_sharded (rank {comm.rank}): checkpoint was saved by {index['world_size']} "
            f"ranks, this job has {comm.size}; load its full state dict instead")
    _check_units(index["units"], _index(fsdp)["units"],
                 manifest.failer(who, os.path.join(directory, "index.json")))
    payload = manifest.load(directory, index["files"][comm.rank], who)
    for unit, shard in zip(fsdp.units, payload["units"]):
        unit.shard.cached_data = type(unit.shard.cached_data)(
            host_array(shard), device=unit.shard.device, dtype=unit.shard.dtype)
    whole = payload["whole"] if comm.rank == 0 else \
        manifest.load(directory, index["files"][0], who)["whole"]
    if whole:
        fsdp.module.load_state_dict({k: host_array(v) for k, v in whole.items()}, strict=False)
    if optimizer is not None:
        if "optimizer" not in payload:
            raise ValueError(f"load_sharded (rank {comm.rank}): no optimizer state was saved")
        optimizer.load_state_dict(payload["optimizer"])
