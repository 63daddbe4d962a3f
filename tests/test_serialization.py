"""Tests for ndl.save / ndl.load: exact round trips, atomic writes, refusal of unsafe files,
and bit-for-bit resumption of training (model, optimizer, RNG and DataLoader order)."""
import math
import os
import pickle
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import needle as ndl
from needle import nn, serialization

pytestmark = pytest.mark.hw2

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]


def _np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _sample(name, shape=(3, 4)):
    a = np.random.randn(*shape) * 50
    if name == "bool":
        return a > 0
    return a.astype(_np_dtype(name))


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(tmp_path, dtype):
    arr = _sample(dtype)
    obj = {"tensor": ndl.Tensor(arr, dtype=dtype, requires_grad=False),
           "ndarray": ndl.NDArray(arr, dtype=dtype), "numpy": arr,
           "strided": arr[:, ::2].T}  # non-contiguous input
    ndl.save(obj, tmp_path / "c.ndl")
    out = ndl.load(tmp_path / "c.ndl")
    assert isinstance(out["tensor"], ndl.Tensor) and out["tensor"].dtype == dtype
    assert isinstance(out["ndarray"], ndl.NDArray) and out["ndarray"].dtype == dtype
    _same_bits(out["tensor"].numpy(), arr)
    _same_bits(out["ndarray"].numpy(), arr)
    _same_bits(out["numpy"], arr)
    _same_bits(out["strided"], arr[:, ::2].T)


def test_round_trip_nested_structure_and_scalars(tmp_path):
    obj = {
        "ints": [0, -1, 2 ** 70],  # arbitrary precision survives
        "floats": (0.1, -0.0, math.inf, 1e-310, 1.0 / 3.0),
        "flags": [True, False, None],
        "text": "héllo", "raw": b"\x00\xff",
        3: {"nested": [np.float32(1.5), np.int64(7), np.zeros((0, 2), np.float32)]},
        "grad": ndl.Tensor(np.ones((2,)), requires_grad=True),
        "empty": {}, "empty_list": [],
    }
    ndl.save(obj, tmp_path / "c.ndl")
    out = ndl.load(tmp_path / "c.ndl")
    assert out["ints"] == [0, -1, 2 ** 70]
    assert isinstance(out["floats"], tuple)
    assert [f.hex() for f in out["floats"]] == [f.hex() for f in obj["floats"]]
    assert out["flags"] == [True, False, None] and out["text"] == "héllo"
    assert out["raw"] == b"\x00\xff" and out["empty"] == {} and out["empty_list"] == []
    n = out[3]["nested"]
    assert type(n[0]) is np.float32 and n[0] == 1.5 and type(n[1]) is np.int64 and n[1] == 7
    assert n[2].shape == (0, 2)
    assert out["grad"].requires_grad


def test_nan_round_trips(tmp_path):
    ndl.save({"x": float("nan")}, tmp_path / "n.ndl")
    assert math.isnan(ndl.load(tmp_path / "n.ndl")["x"])


@pytest.mark.parametrize("bad", [object(), {1, 2}, {(1, 2): 3}, np.array([1, "a"], dtype=object)])
def test_save_rejects_unsupported_values(tmp_path, bad):
    with pytest.raises(TypeError):
        ndl.save({"x": bad}, tmp_path / "c.ndl")
    assert os.listdir(tmp_path) == []  # nothing half-written is left behind


def test_module_and_optimizer_state_round_trip(tmp_path):
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
    opt = ndl.optim.Adam(model.parameters(), lr=0.01)
    x = ndl.Tensor(np.random.randn(8, 4))
    nn.SoftmaxLoss()(model(x), ndl.Tensor(np.arange(8) % 2, dtype="int64")).backward()
    opt.step()
    ndl.save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path / "m.ndl")
    ck = ndl.load(tmp_path / "m.ndl")
    np.random.seed(1)
    other = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
    other.load_state_dict(ck["model"])
    model.eval()
    other.eval()
    np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())
    opt2 = ndl.optim.Adam(other.parameters(), lr=0.5)
    opt2.load_state_dict(ck["optim"])
    assert opt2.lr == 0.01
    for k, v in opt.state_dict()["state"].items():
        for name, val in v.items():
            _same_bits(opt2.state_dict()["state"][k][name], val)


# ------------------------------------------------------------------------- atomicity
def test_failed_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(5.0)}, path)
    before = path.read_bytes()

    def boom(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk on fire"):
        ndl.save({"w": np.zeros(1000)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.ndl"]  # the temp file was removed
    np.testing.assert_array_equal(ndl.load(path)["w"], np.arange(5.0))


def test_crash_mid_write_leaves_old_checkpoint_intact(tmp_path):
    """A process that dies half-way through writing must not damage the existing file."""
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(5.0)}, path)
    before = path.read_bytes()
    child = textwrap.dedent(f"""
        import os, numpy as np, needle as ndl
        from needle import serialization as s
        real_write = s._write
        def dying_write(f, tree, arrays):
            f.write(b"NDLCKPT1" + b"\\x00" * 100)  # a partial record ...
            f.flush()
            os._exit(3)                            # ... then the process is killed
        s._write = dying_write
        ndl.save({{"w": np.zeros(10 ** 6)}}, {str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert proc.returncode == 3, proc.stderr.decode()
    assert path.read_bytes() == before
    np.testing.assert_array_equal(ndl.load(path)["w"], np.arange(5.0))


# ------------------------------------------------------------------------- unsafe files
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_checkpoint_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    for proto in (2, 4, 5):
        path = tmp_path / f"evil{proto}.pkl"
        with open(path, "wb") as f:
            pickle.dump({"model": _Payload(str(marker))}, f, protocol=proto)
        with pytest.raises(ValueError, match="pickle"):
            ndl.load(path)
    assert not marker.exists()


def test_npz_with_object_array_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    np.savez(tmp_path / "evil.npz", w=np.array([_Payload(str(marker))], dtype=object))
    with pytest.raises(ValueError, match="npz|not a valid"):
        ndl.load(tmp_path / "evil.npz")
    assert not marker.exists()


def _rewrite_header(path, mutate):
    raw = path.read_bytes()
    import json
    import struct
    (hlen,) = struct.unpack("<Q", raw[8:16])
    header = json.loads(raw[16:16 + hlen])
    mutate(header)
    # A hostile writer recomputes the header checksum: the checks behind it must still hold.
    header["crc32"] = serialization._header_crc(header["tree"], header["arrays"])
    new = json.dumps(header).encode()
    path.write_bytes(raw[:8] + struct.pack("<Q", len(new)) + new + raw[16 + hlen:])


def test_tampered_or_truncated_checkpoints_are_refused(tmp_path):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(6.0).reshape(2, 3)}, path)
    good = path.read_bytes()
    path.write_bytes(good[:-8])
    with pytest.raises(ValueError, match="past the end|truncated"):
        ndl.load(path)
    path.write_bytes(good)
    _rewrite_header(path, lambda h: h["arrays"][0].update(dtype="object"))
    with pytest.raises(ValueError, match="disallowed dtype 'object'"):
        ndl.load(path)
    path.write_bytes(good)
    _rewrite_header(path, lambda h: h["tree"].update(t="eval"))
    with pytest.raises(ValueError, match="unknown node type 'eval'"):
        ndl.load(path)
    path.write_bytes(b"garbage!" * 4)
    with pytest.raises(ValueError, match="bad magic"):
        ndl.load(path)
    with pytest.raises(FileNotFoundError, match="missing.ndl"):
        ndl.load(tmp_path / "missing.ndl")


def _corrupt_copies(good: bytes, start: int):
    """(what, bytes) pairs: one flipped bit per array payload, 4 KiB zeroed, a flipped scalar."""
    flipped = bytearray(good)
    flipped[start + 8 * 1000 + 3] ^= 0x10  # inside "w", element 1000
    yield "obj['w']", bytes(flipped)
    zeroed = bytearray(good)
    zeroed[start + 8000:start + 8000 + 4096] = bytes(4096)  # 4 KiB in the middle of "w"
    yield "array 0 (obj['w']", bytes(zeroed)
    flipped = bytearray(good)
    flipped[-1] ^= 0x01  # the last byte of "b"
    yield "obj['b']", bytes(flipped)
    at = good.index(b"0x1.999999999999ap-4")  # the float 0.1 in the header's tree
    yield "header's checksum", good[:at] + b"0x1.999999999999bp-4" + good[at + 20:]


def test_corrupt_payload_or_header_is_refused_naming_file_and_array(tmp_path):
    """A checkpoint with a byte flipped or 4 KiB zeroed loads with an error, never silently."""
    import struct
    path = tmp_path / "c.ndl"
    rng = np.random.default_rng(1)
    ndl.save({"w": rng.standard_normal(2000), "b": rng.standard_normal(600).astype(np.float32),
              "lr": 0.1}, path)
    good = path.read_bytes()
    (hlen,) = struct.unpack("<Q", good[8:16])
    start = 16 + hlen  # array 0 ("w") starts here
    assert ndl.load(path)["lr"] == 0.1
    for what, bad in _corrupt_copies(good, start):
        path.write_bytes(bad)
        with pytest.raises(serialization.CheckpointError) as info:
            ndl.load(path)
        assert str(path) in str(info.value) and what in str(info.value), str(info.value)


def test_deeply_nested_header_is_refused_cleanly(tmp_path):
    """A hostile header nested past Python's recursion limit is a CheckpointError, no crash."""
    import struct
    path = tmp_path / "deep.ndl"
    depth = 100_000
    header = ('{"tree":' + '{"t":"list","v":[' * depth + ']}' * depth + ',"arrays":[]}').encode()
    path.write_bytes(b"NDLCKPT1" + struct.pack("<Q", len(header)) + header)
    with pytest.raises(ValueError, match="not a valid needle checkpoint"):
        ndl.load(path)


# ------------------------------------------------------------------------- exact resume
def _make(seed):
    np.random.seed(seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    return model, ndl.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-4)


def _train(model, opt, loader, n_steps):
    losses = []
    loss_fn = nn.SoftmaxLoss()
    while len(losses) < n_steps:
        for x, y in loader:
            opt.reset_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.numpy().tobytes())
            if len(losses) == n_steps:
                break
    return losses


@pytest.mark.parametrize("seeded_loader", [True, False], ids=["generator", "global_rng"])
def test_resume_is_bit_for_bit(tmp_path, seeded_loader):
    X, y = ndl.data.spirals(40, 3, seed=0)
    ds = ndl.data.NDArrayDataset(X, y)

    def loader():
        return ndl.data.DataLoader(ds, batch_size=16, shuffle=True,
                                   seed=5 if seeded_loader else None)

    model, opt = _make(0)
    np.random.seed(123)
    reference = _train(model, opt, loader(), 20)  # 8 batches per epoch: crosses 2 epochs

    model, opt = _make(0)
    dl = loader()
    np.random.seed(123)
    first = _train(model, opt, dl, 11)  # stop mid-epoch
    ndl.save({"model": model.state_dict(), "optim": opt.state_dict(), "data": dl.state_dict(),
              "rng": ndl.random_state()}, tmp_path / "ck.ndl")
    np.random.rand(1000)  # the interrupted process keeps consuming randomness; irrelevant

    ck = ndl.load(tmp_path / "ck.ndl")
    model2, opt2 = _make(99)  # a fresh process with a different init
    dl2 = loader()
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["optim"])
    dl2.load_state_dict(ck["data"])
    ndl.set_random_state(ck["rng"])
    rest = _train(model2, opt2, dl2, 9)
    assert first + rest == reference
    assert len(set(reference)) == len(reference)  # the losses really change step to step


# ------------------------------------------------------------------ what a load trusts
def _header_of(path):
    import json
    import struct
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[8:16])
    return raw, json.loads(raw[16:16 + hlen]), 16 + hlen


def _write_header(path, raw, header, start, rest=None):
    import json
    import struct
    new = json.dumps(header).encode()
    path.write_bytes(raw[:8] + struct.pack("<Q", len(new)) + new
                     + (raw[start:] if rest is None else rest))


def test_file_without_checksums_loads_only_unverified(tmp_path):
    """The older format (no checksums) is refused by default: a flipped byte in it is invisible."""
    path = tmp_path / "old.ndl"
    w = np.arange(100.0)
    ndl.save({"w": w}, path)
    raw, header, start = _header_of(path)
    del header["crc32"]
    for e in header["arrays"]:
        del e["crc32"], e["name"]
    body = bytearray(raw[start:])
    body[8 * 7] ^= 0x40  # element 7 of w
    _write_header(path, raw, header, start, bytes(body))
    with pytest.raises(serialization.CheckpointError, match="verify=False") as info:
        ndl.load(path)
    assert str(path) in str(info.value)
    loaded = ndl.load(path, verify=False)["w"]
    assert loaded[7] != w[7] and np.array_equal(np.delete(loaded, 7), np.delete(w, 7))


def test_one_array_named_many_times_is_refused(tmp_path):
    """A header cannot make a small file ask for many times its size."""
    path = tmp_path / "amp.ndl"
    ndl.save({"w": np.zeros(10_000)}, path)
    raw, header, start = _header_of(path)
    leaf = header["tree"]["v"][0][1]
    header["tree"] = {"t": "list", "v": [leaf] * 1000}  # 80 MB from an 80 kB file
    header["crc32"] = serialization._header_crc(header["tree"], header["arrays"])
    _write_header(path, raw, header, start)
    with pytest.raises(serialization.CheckpointError, match="referenced twice"):
        ndl.load(path)
    raw, header, start = _header_of(path)
    header["arrays"] = header["arrays"] * 1000  # 1000 table rows over the same bytes
    header["tree"] = {"t": "list", "v": [{"t": "numpy", "v": i} for i in range(1000)]}
    header["crc32"] = serialization._header_crc(header["tree"], header["arrays"])
    _write_header(path, raw, header, start)
    with pytest.raises(serialization.CheckpointError, match="overlaps"):
        ndl.load(path)


def _crafted(header):
    """(what, mutate) pairs: numbers that made int()/float.fromhex/np.prod/dict() raise."""
    yield "float overflow", lambda h: h["tree"]["v"].append(["x", {"t": "float", "v": "0x1p99999"}])
    yield "bad hex", lambda h: h["tree"]["v"].append(["x", {"t": "bytes", "v": "zz"}])
    yield "list key", lambda h: h["tree"]["v"].append([[1], {"t": "const", "v": None}])
    yield "float shape", lambda h: h["arrays"][0].update(shape=[1e300, 1e300])
    yield "huge shape", lambda h: h["arrays"][0].update(shape=[2 ** 70, 2 ** 70])
    yield "string offset", lambda h: h["arrays"][0].update(offset="abc")
    yield "index as float", lambda h: h["tree"]["v"][0][1].update(v=0.0)
    yield "scalar node", lambda h: h["tree"]["v"].append(3)
    yield "short pair", lambda h: h["tree"]["v"].append(["only a key"])


def test_crafted_numbers_raise_only_checkpoint_error(tmp_path):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.ones(4)}, path)
    good = path.read_bytes()
    for what, mutate in _crafted(None):
        path.write_bytes(good)
        raw, header, start = _header_of(path)
        mutate(header)
        header["crc32"] = serialization._header_crc(header["tree"], header["arrays"])
        _write_header(path, raw, header, start)
        with pytest.raises(Exception) as info:
            ndl.load(path)
        assert type(info.value) is serialization.CheckpointError, (what, info.value)
        assert str(path) in str(info.value), what
    path.write_bytes(good[:8] + b"\xff" * 8 + good[16:])  # header length 2**64 - 1
    with pytest.raises(serialization.CheckpointError, match="exceeds the file size"):
        ndl.load(path)


_PEAK = """
import sys, tracemalloc
import numpy as np
import needle as ndl
path, kind = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
leaves = [rng.standard_normal(250_000) for _ in range(8)]  # 8 x 2 MB
obj = {str(i): (ndl.Tensor(a) if kind == "tensor" else a) for i, a in enumerate(leaves)}
ndl.save(obj, path)
del obj, leaves
tracemalloc.start()
out = ndl.load(path)
print(tracemalloc.get_traced_memory()[1])
"""


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_load_holds_about_the_file_size(tmp_path, kind):
    """Peak memory of a load (tracemalloc, fresh process): the file's size, plus for Tensors
    one array's copy into its NDArray; not the file read whole plus a copy of every array."""
    path = tmp_path / "big.ndl"
    peak = int(subprocess.run([sys.executable, "-c", _PEAK, str(path), kind], check=True,
                              capture_output=True, text=True, timeout=120).stdout)
    size = path.stat().st_size
    largest = 2_000_000
    allowed = size * 1.05 + (largest if kind == "tensor" else 0)
    assert peak <= allowed, f"peak {peak} bytes for a {size}-byte file"


def test_save_keeps_the_mode_and_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real.ndl"
    ndl.save({"a": np.ones(2)}, real)
    assert real.stat().st_mode & 0o777 == 0o666 & ~_umask()  # a new file: as open() makes it
    os.chmod(real, 0o640)
    link = tmp_path / "latest.ndl"
    link.symlink_to(real)
    ndl.save({"a": np.zeros(3)}, link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.stat().st_mode & 0o777 == 0o640
    np.testing.assert_array_equal(ndl.load(real)["a"], np.zeros(3))


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_KILLED_SAVE = """
import sys, time
from needle import serialization
def write(f):
    f.write(b"partial")
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
serialization.write_atomic(sys.argv[1], write)
"""


def test_a_save_killed_mid_write_is_cleaned_up_by_the_next(tmp_path):
    import signal
    path = tmp_path / "ck.ndl"
    ndl.save({"a": np.ones(2)}, path)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    left = [p.name for p in tmp_path.iterdir() if p.name != "ck.ndl"]
    assert len(left) == 1 and str(child.pid) in left[0], left  # what the kill left behind
    live = tmp_path / left[0].replace(str(child.pid), str(os.getpid()))
    live.write_bytes(b"a save still running")  # a live process's file is not touched
    np.testing.assert_array_equal(ndl.load(path)["a"], np.ones(2))
    ndl.save({"a": np.zeros(2)}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ck.ndl", live.name])
    np.testing.assert_array_equal(ndl.load(path)["a"], np.zeros(2))
