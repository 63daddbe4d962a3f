"""Checkpoints that change the pipeline layout: save at pp=p, load at any pp=q (pp=1 included).

A stage is a run of consecutive layers of one ``nn.Sequential``; stage s writes
``stage<s>.ndl`` with its layers renamed to their *global* index ("modules.5.weight" rather than
the stage-local "modules.1.weight"). Loading merges every stage file and keeps the layers the new
stage holds, so any partition (or the whole model on one rank) can read it.
"""
import glob
import os
from typing import Any, Dict

import numpy as np

from ...nn.nn_basic import Sequential
from ...serialization import load, save

__all__ = ["save_stage", "load_stage"]


def _index(name: str) -> int:
    """The layer index of a Sequential's state name ("modules.<i>.<rest>")."""
    return int(name.split(".", 2)[1])


def _rename(state: Dict[str, Any], shift: int) -> Dict[str, Any]:
    out = {}
    for name, value in state.items():
        head, i, rest = name.split(".", 2)
        out[f"{head}.{int(i) + shift}.{rest}"] = value
    return out


def save_stage(stage: Sequential, first_layer: int, comm: Any, directory: str) -> None:
    """Write this stage's layers under their global indices (collective: ends in a barrier)."""
    os.makedirs(directory, exist_ok=True)
    save(_rename(stage.state_dict(), first_layer),
         os.path.join(directory, f"stage{comm.rank}.ndl"))
    comm.barrier()


def load_stage(stage: Sequential, first_layer: int, directory: str) -> None:
    """Load layers [first_layer, first_layer + len(stage)) from a checkpoint of any layout."""
    merged: Dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(directory, "stage*.ndl"))):
        merged.update(load(path))
    if not merged:
        raise FileNotFoundError(f"no stage*.ndl pipeline checkpoint in {directory}")
    end = first_layer + len(stage)
    mine = {n: np.asarray(v) for n, v in merged.items()
            if first_layer <= _index(n) < end}
    stage.load_state_dict(_rename(mine, -first_layer))
