"""Fault injection, checkpoints: stale files from another layout, files rewritten after the
manifest, corrupt bytes and truncated manifests are refused naming the file; never mixed in."""
import json
import os

import numpy as np
import pytest
from dp_helpers import fsdp_save_or_load as _fsdp
from mpi_helpers import BACKENDS, run_ranks

from needle import nn, serialization
from needle.parallel.pipeline import partition
from needle.parallel.pipeline.stage_state import load_stage, save_stage
from needle.parallel.tensor_parallel import tp_checkpoint as tp_state

pytestmark = pytest.mark.faults


def build(seed):
    np.random.seed(seed)
    return nn.Sequential(*[nn.Linear(4, 4, dtype="float64") for _ in range(8)])


def _save(comm, directory, seed):
    stages = partition(build(seed), comm.size)
    save_stage(stages[comm.rank], sum(len(s) for s in stages[:comm.rank]), comm, directory)


def _load(comm, directory):
    stages = partition(build(99), comm.size)
    first = sum(len(s) for s in stages[:comm.rank])
    try:
        load_stage(stages[comm.rank], first, directory)
    except (ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return {f"{k.split('.')[0]}.{int(k.split('.')[1]) + first}.{k.split('.', 2)[2]}": v
            for k, v in stages[comm.rank].state_dict().items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_pp2_save_over_a_pp4_folder_loads_only_the_pp2_weights(tmp_path, backend):
    """pp=4 leaves stage2/stage3.ndl behind; the pp=2 save's manifest never names them."""
    run_ranks(backend, 4, _save, str(tmp_path), 0)
    run_ranks(backend, 2, _save, str(tmp_path), 1)
    assert os.path.exists(tmp_path / "stage3.ndl")  # the stale file is still there
    want = build(1).state_dict()
    got = {}
    for part in run_ranks(backend, 2, _load, str(tmp_path)):
        got.update(part)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_stage_file_rewritten_after_the_manifest_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_ranks("virtual", 2, _save, str(a), 0)
    run_ranks("virtual", 2, _save, str(b), 1)
    os.replace(b / "stage1.ndl", a / "stage1.ndl")  # a foreign file under a's manifest
    errors = run_ranks("virtual", 2, _load, str(a))
    assert isinstance(errors[0], dict)  # rank 0's layers come from stage0 only: intact
    assert "CheckpointError" in errors[1] and str(a / "stage1.ndl") in errors[1]
    assert "checksum" in errors[1]


def test_missing_or_truncated_manifest_names_the_file(tmp_path):
    run_ranks("virtual", 2, _save, str(tmp_path), 0)
    path = tmp_path / "pipeline.json"
    path.write_text(path.read_text()[:40])
    err = run_ranks("virtual", 2, _load, str(tmp_path))[0]
    assert "CheckpointError" in err and str(path) in err and "truncated or not JSON" in err
    path.unlink()
    err = run_ranks("virtual", 2, _load, str(tmp_path))[0]
    assert "FileNotFoundError" in err and "no pipeline.json" in err


def _tp_save(comm, directory):
    np.random.seed(3)
    tp_state.save_sharded(nn.Linear(4, 6, dtype="float64"), comm, directory)


def _tp_load(comm, directory):
    try:
        tp_state.load_sharded(nn.Linear(4, 6, dtype="float64"), comm, directory)
    except (ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def test_tp_shard_with_a_flipped_byte_is_refused_naming_the_file(tmp_path):
    run_ranks("virtual", 1, _tp_save, str(tmp_path))
    assert run_ranks("virtual", 1, _tp_load, str(tmp_path)) == [None]
    shard = tmp_path / "shard0.ndl"
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x40
    shard.write_bytes(bytes(raw))
    err = run_ranks("virtual", 1, _tp_load, str(tmp_path))[0]
    assert str(shard) in err and "checksum" in err
    index = json.loads((tmp_path / "index.json").read_text())
    assert [f["file"] for f in index["files"]] == ["shard0.ndl"]


def test_ndl_load_names_the_corrupt_array(tmp_path):
    path = tmp_path / "m.ndl"
    serialization.save({"a": np.ones(3), "b": np.zeros(1000)}, path)
    raw = bytearray(path.read_bytes())
    raw[-100] = 7
    path.write_bytes(bytes(raw))
    with pytest.raises(serialization.CheckpointError, match=r"array 1 \(obj\['b'\]"):
        serialization.load(path)


def test_fsdp_truncated_index_or_corrupt_shard_names_the_file(tmp_path):
    run_ranks("virtual", 2, _fsdp, str(tmp_path), True)
    assert run_ranks("virtual", 2, _fsdp, str(tmp_path), False) == [None, None]
    index = tmp_path / "index.json"
    good = index.read_text()
    index.write_text(good[:len(good) // 2])
    for r, err in enumerate(run_ranks("virtual", 2, _fsdp, str(tmp_path), False)):
        assert f"load_sharded (rank {r}): {index} is truncated or not JSON" in err
    index.write_text(good)
    shard = tmp_path / "shard-00001-of-00002.ndl"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) - 3] ^= 1
    shard.write_bytes(bytes(raw))
    err = run_ranks("virtual", 2, _fsdp, str(tmp_path), False)[1]
    assert str(shard) in err and "checksum" in err


def _zero_state(comm, save_mb, load_mb):
    import needle as ndl
    from needle.parallel import ZeroRedundancyOptimizer
    np.random.seed(2)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    opt = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm,
                                  bucket_cap_mb=save_mb, lr=0.1)
    state = opt.state_dict()
    again = ZeroRedundancyOptimizer(model.parameters(), ndl.optim.Adam, comm,
                                    bucket_cap_mb=load_mb, lr=0.1)
    try:
        again.load_state_dict(state)
    except ValueError as err:
        return str(err)
    return None


def test_zero_state_from_another_bucket_layout_is_refused():
    """ZeRO state saved with another bucket layout is refused on every rank, naming the stage;
the same layout loads (zip() over the shards would load the wrong pieces silently)."""
    assert run_ranks("virtual", 2, _zero_state, 25.0, 25.0) == [None, None]
    for r, err in enumerate(run_ranks("virtual", 2, _zero_state, 25.0, 1e-4)):
        assert f"ZeroRedundancyOptimizer (rank {r}): state saved at stage 1" in err, err
