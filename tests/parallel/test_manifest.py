"""Sharded checkpoints' manifests: checksummed, each entry bound to its rank, layout and file,
kept inside their folder; every corruption a CheckpointError naming the manifest or the file."""
import json
import os

import numpy as np
import pytest
from dp_helpers import fsdp_save_or_load as _fsdp
from mpi_helpers import run_ranks

from needle import nn
from needle.parallel import manifest
from needle.parallel.pipeline import partition
from needle.parallel.pipeline.stage_state import load_stage, save_stage
from needle.parallel.tensor_parallel import tp_checkpoint as tp_state


def _tp_model():
    np.random.seed(3)
    return nn.Linear(4, 6, dtype="float64")


def _tp_save(comm, directory):
    tp_state.save_sharded(_tp_model(), comm, directory)


def _tp_load(comm, directory):
    m = nn.Linear(4, 6, dtype="float64")
    try:
        tp_state.load_sharded(m, comm, directory)
    except (ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return m.state_dict()


def _edit(path, mutate, reseal=True):
    """Rewrite a manifest; ``reseal`` recomputes its own checksum, as a careful forger would."""
    index = json.loads(path.read_text())
    mutate(index)
    if reseal:
        index["crc32"] = manifest._crc(index)
    path.write_text(json.dumps(index))


def _swap(index):
    a, b = index["files"]
    a["file"], b["file"], a["crc32"], b["crc32"] = b["file"], a["file"], b["crc32"], a["crc32"]


def _twice(index):
    index["files"][1].update(file=index["files"][0]["file"], crc32=index["files"][0]["crc32"])


EDITS = [  # (what, mutate, reseal, words of the error)
    ("one rank's file listed twice", _twice, True, "entry 1 names file 'shard0.ndl'"),
    ("two files swapped", _swap, True, "entry 0 names file 'shard1.ndl'"),
    ("tp field edited", lambda i: i.update(tp=3), False, "its own checksum does not match"),
    ("tp field edited, resealed", lambda i: i.update(tp=3), True, "'tp' field says 3"),
    ("layout with dp", lambda i: i["layout"].update(dp=2), True, "spans tp only"),
    ("an entry's rank", lambda i: i["files"][1].update(rank=0), True, "entry 1 names rank 0"),
    ("a path outside", lambda i: i["files"][1].update(file="../shard1.ndl"), True,
     "names file '../shard1.ndl'"),
    ("an absolute path", lambda i: i["files"][0].update(file="/etc/passwd"), True,
     "names file '/etc/passwd'"),
    ("an entry dropped", lambda i: i["files"].pop(), True, "tp=2 but 1 entries"),
    ("no extra", lambda i: i["files"][0].pop("extra"), True, "entry 0 has extra None"),
    ("axes missing a name", lambda i: i["axes"].pop("weight"), True, "not this model's"),
    ("axes out of range", lambda i: i["axes"].update(weight=5), True, "not this model's"),
    ("a replicated bias split", lambda i: i["axes"].update(bias=0), True, "not this model's"),
    ("the older format", lambda i: [e.pop("rank") for e in i["files"]] and i.pop("crc32"), False,
     "written by an older needle"),
]


@pytest.mark.parametrize("what,mutate,reseal,words", EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_tp_manifest_is_refused_naming_it(tmp_path, what, mutate, reseal, words):
    run_ranks("virtual", 2, _tp_save, str(tmp_path))
    index = tmp_path / "index.json"
    _edit(index, mutate, reseal)
    for err in run_ranks("virtual", 2, _tp_load, str(tmp_path)):
        assert isinstance(err, str) and err.startswith("CheckpointError"), (what, err)
        assert str(index) in err and words in err, err


def test_a_shard_symlinked_out_of_the_folder_is_refused(tmp_path):
    ck, outside = tmp_path / "ck", tmp_path / "elsewhere.ndl"
    run_ranks("virtual", 2, _tp_save, str(ck))
    os.replace(ck / "shard1.ndl", outside)  # the same bytes: its checksum still matches
    (ck / "shard1.ndl").symlink_to(outside)
    for err in run_ranks("virtual", 2, _tp_load, str(ck)):
        assert err.startswith("CheckpointError") and "leads out of the checkpoint's folder" in err
        assert str(ck / "index.json") in err


def test_a_tp_manifest_round_trips_and_reshards(tmp_path):
    run_ranks("virtual", 2, _tp_save, str(tmp_path))
    want = _tp_model().state_dict()
    (got,) = run_ranks("virtual", 1, _tp_load, str(tmp_path))  # tp=2 -> tp=1
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["layout"] == {"tp": 2, "pp": 1, "dp": 1}
    assert [(e["rank"], e["file"], e["layout"]) for e in index["files"]] == \
        [(0, "shard0.ndl", index["layout"]), (1, "shard1.ndl", index["layout"])]


def _pp_model(seed):
    np.random.seed(seed)
    return nn.Sequential(*[nn.Linear(3, 3, dtype="float64") for _ in range(4)])


def _pp_save(comm, directory):
    stages = partition(_pp_model(0), comm.size)
    save_stage(stages[comm.rank], sum(len(s) for s in stages[:comm.rank]), comm, directory)


def _pp_load(comm, directory):
    stages = partition(_pp_model(1), comm.size)
    try:
        load_stage(stages[comm.rank], sum(len(s) for s in stages[:comm.rank]), directory)
    except (ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return None


PP_EDITS = [
    ("overlapping ranges", lambda i: i["files"][1].update(extra=[1, 3]), "before it end at 2"),
    ("stages field", lambda i: i.update(stages=4), "'stages' field says 4"),
    ("layout with tp", lambda i: i["layout"].update(tp=2), "spans pp only"),
]


@pytest.mark.parametrize("what,mutate,words", PP_EDITS, ids=[e[0] for e in PP_EDITS])
def test_an_edited_pipeline_manifest_is_refused(tmp_path, what, mutate, words):
    run_ranks("virtual", 2, _pp_save, str(tmp_path))
    assert run_ranks("virtual", 2, _pp_load, str(tmp_path)) == [None, None]
    _edit(tmp_path / "pipeline.json", mutate)
    err = run_ranks("virtual", 2, _pp_load, str(tmp_path))[0]
    assert err.startswith("CheckpointError") and words in err, err
    assert str(tmp_path / "pipeline.json") in err


@pytest.mark.parametrize("what,mutate,words", [
    ("a unit's size", lambda i: i["units"][0].update(numel=21), "unit 0 is"),
    ("units not a list", lambda i: i.update(units="modules.0"), "no list of units"),
    ("a unit dropped", lambda i: i["units"].pop(), "1 units, this model has 2")])
def test_an_edited_fsdp_index_is_refused_naming_it(tmp_path, what, mutate, words):
    run_ranks("virtual", 2, _fsdp, str(tmp_path), True)
    _edit(tmp_path / "index.json", mutate)
    for err in run_ranks("virtual", 2, _fsdp, str(tmp_path), False):
        assert err.startswith("CheckpointError") and words in err, err
        assert str(tmp_path / "index.json") in err
