"""Checkpoints that change the pipeline layout: save at pp=p, load at any pp=q (pp=1 included).
Layers are saved under their *global* index; ``pipeline.json`` (``manifest.py``) names the files."""
import os
from typing import Any, Dict

import numpy as np

from ...nn.nn_basic import Sequential
from ...serialization import save
from .. import manifest
from ..comm.protocol import Comm

MANIFEST = "pipeline.json"
KIND = manifest.Kind("needle-pipeline-1", "pp", "stages", lambda r, n: f"stage{r}.ndl", 2)

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


def save_stage(stage: Sequential, first_layer: int, comm: Comm, directory: str) -> None:
    """Write this stage's layers under their global indices (collective: ends in a barrier)."""
    os.makedirs(directory, exist_ok=True)
    mine = KIND.file_name(comm.rank, comm.size)
    save(_rename(stage.state_dict(), first_layer), os.path.join(directory, mine))
    manifest.write(comm, directory, MANIFEST, KIND, [first_layer, len(stage)], {})


def load_stage(stage: Sequential, first_layer: int, directory: str) -> None:
    """Load layers [first_layer, first_layer + len(stage)) from a checkpoint of any layout."""
    index = manifest.read(directory, MANIFEST, KIND, "load_stage", {"tp": 1, "dp": 1})
    fail = manifest.failer("load_stage", os.path.join(directory, MANIFEST))
    end, lo_next = first_layer + len(stage), 0
    merged: Dict[str, Any] = {}
    for entry in index["files"]:
        lo, n = entry["extra"]
        if lo != lo_next or n < 0:
            raise fail(f"stage {entry['rank']} holds layers from {lo} (x{n}); the stages "
                       f"before it end at {lo_next}")
        lo_next = lo + n
        if lo < end and first_layer < lo + n:  # this stage file holds some of our layers
            merged.update(_layers(manifest.load(directory, entry, "load_stage"), lo, n, fail))
    mine = {n: np.asarray(v) for n, v in merged.items()
            if first_layer <= _index(n) < end}
    stage.load_state_dict(_rename(mine, -first_layer))


def _layers(state: Any, lo: int, n: int, fail: Any) -> Dict[str, Any]:
    """A stage file's state, every name a layer of its range [lo, lo + n)."""
    if not isinstance(state, dict):
        raise fail(f"a stage file holds {type(state).__name__}, not a state dict")
    for name in state:
        parts = name.split(".", 2) if isinstance(name, str) else []
        if len(parts) != 3 or not parts[1].isdigit() or not lo <= int(parts[1]) < lo + n:
            raise fail(f"a stage file of layers [{lo}, {lo + n}) holds {str(name)[:60]!r}")
    return state
