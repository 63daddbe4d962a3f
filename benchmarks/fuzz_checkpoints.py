"""Fuzz ``ndl.load`` and the sharded checkpoints' manifests with seeded corruptions.

    python benchmarks/fuzz_checkpoints.py --cases 20000 --seed 1        # the long run
    python benchmarks/fuzz_checkpoints.py --cases 300 --seed 0 --json   # what the suite runs

Each case corrupts a good checkpoint one way and loads it:

* a corruption (bytes flipped, zeroed, inserted, deleted, the file cut short, a header or
  manifest field edited without recomputing its checksum, a shard's bytes flipped, two shards
  swapped, a shard replaced by a symlink out of the folder) must be refused with
  ``CheckpointError`` or load exactly the saved values;
* a forgery (a header or manifest edited and its own checksum recomputed, as a careful writer of
  a bad file would) must be refused with ``CheckpointError`` or load without any other error.

Anything else (another exception, different values from a corruption) is a failure, printed
with its case. Exit status 1 if any case failed.
"""
import copy
import json
import os
import random
import shutil
import struct
import sys
import tempfile
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

import needle as ndl
from needle import cli, nn, serialization
from needle.parallel import manifest, virtual
from needle.parallel.pipeline.stage_state import load_stage, save_stage
from needle.parallel.tensor_parallel import ColumnParallelLinear
from needle.parallel.tensor_parallel import tp_checkpoint as tp_state

CheckpointError = serialization.CheckpointError
Outcome = Tuple[str, str]  # (refused | exact | loaded | FAIL, detail)


def reference() -> Dict[str, Any]:
    """The object every ndl.load case saves: several dtypes, a Tensor, scalars, nesting."""
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": rng.standard_normal(8),
            "idx": np.arange(20, dtype=np.int64), "mask": rng.random(12) > 0.5,
            "h": rng.standard_normal(5).astype(np.float16), "scalar": np.float64(2.5),
            "t": ndl.Tensor(rng.standard_normal((3, 4)).astype(np.float32)),
            "meta": {"lr": 0.1, "step": 7, "name": "adam", "none": None, "raw": b"\x00\x01",
                     "betas": (0.9, 0.999), "hist": [1.5, float("nan"), -0.0]}}


def same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two loaded trees (types, dtypes, shapes, bytes, float bits)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, ndl.Tensor):
        return a.requires_grad == b.requires_grad and same(a.numpy(), b.numpy())
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


# ------------------------------------------------------------------------ byte corruptions
def flip(raw: bytes, rng: random.Random) -> bytes:
    out = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] ^= rng.randint(1, 255)
    return bytes(out)


def zero(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw))
    n = rng.randint(1, 4096)
    return raw[:at] + bytes(len(raw[at:at + n])) + raw[at + n:]


def cut(raw: bytes, rng: random.Random) -> bytes:
    return raw[:rng.randrange(len(raw))]


def insert(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw))
    return raw[:at] + bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))) + raw[at:]


def delete(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw))
    return raw[:at] + raw[at + rng.randint(1, 64):]


BYTE_EDITS: List[Callable[[bytes, random.Random], bytes]] = [flip, zero, cut, insert, delete]


# ------------------------------------------------------------------------ JSON edits
WEIRD = [2 ** 70, -1, 0, 1, 1e308, -1e308, "abc", "", None, True, [], {}, [0, 0], "0x1p99999",
         "../../etc/passwd", "/etc/passwd", "float64", "object", 0.5]


def _slots(node: Any, out: List[Tuple[Any, Any]]) -> List[Tuple[Any, Any]]:
    """Every (container, key) pair of a JSON tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for k, v in items:
        out.append((node, k))
        _slots(v, out)
    return out


def edit_json(doc: Any, rng: random.Random) -> Any:
    """A copy of ``doc`` with one random field replaced, duplicated, dropped or swapped."""
    doc = copy.deepcopy(doc)
    slots = _slots(doc, [])
    parent, key = rng.choice(slots)
    how = rng.randrange(5)
    if how == 0:
        parent[key] = copy.deepcopy(rng.choice(WEIRD))
    elif how == 1:
        parent[key] = copy.deepcopy(rng.choice(slots)[0])  # another part of the tree
    elif how == 2 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))  # a duplicated entry
    elif how == 3:
        del parent[key]
    else:
        other, k2 = rng.choice(slots)
        parent[key], other[k2] = other[k2], parent[key]
    return doc


def edit_header(raw: bytes, rng: random.Random, reseal: bool) -> bytes:
    """The checkpoint with one header field edited (its checksum recomputed if ``reseal``)."""
    (hlen,) = struct.unpack("<Q", raw[8:16])
    header = edit_json(json.loads(raw[16:16 + hlen]), rng)
    if reseal and isinstance(header, dict):
        try:
            header["crc32"] = serialization._header_crc(header.get("tree"), header.get("arrays"))
        except (TypeError, ValueError):
            pass
    new = json.dumps(header, separators=(",", ":")).encode()
    return raw[:8] + struct.pack("<Q", len(new)) + new + raw[16 + hlen:]


# ------------------------------------------------------------------------ ndl.load cases
def load_case(good: bytes, want: Any, path: str, rng: random.Random) -> Tuple[str, Outcome]:
    """One corrupted or forged ndl.load file, and how its load ended."""
    kind = rng.choice([e.__name__ for e in BYTE_EDITS] + ["header", "forged header"])
    if kind == "header":
        bad = edit_header(good, rng, reseal=False)
    elif kind == "forged header":
        bad = edit_header(good, rng, reseal=True)
    else:
        bad = next(e for e in BYTE_EDITS if e.__name__ == kind)(good, rng)
    with open(path, "wb") as f:
        f.write(bad)
    forged = kind == "forged header"
    return "ndl.load " + kind, judge(lambda: ndl.load(path), want, forged)


def judge(load: Callable[[], Any], want: Any, forged: bool) -> Outcome:
    """refused / exact / loaded (a forgery) / FAIL with the reason."""
    try:
        got = load()
    except CheckpointError as err:
        return "refused", str(err)[:120]
    except Exception as err:  # what the fuzz is for: any other exception is a finding
        return "FAIL", f"{type(err).__name__}: {str(err)[:300]}"
    if same(got, want):
        return "exact", ""
    return ("loaded", "") if forged else ("FAIL", "loaded different values without an error")


# ------------------------------------------------------------------------ manifest cases
def _pp_model(seed: int) -> nn.Sequential:
    np.random.seed(seed)
    return nn.Sequential(*[nn.Linear(3, 3, dtype="float64") for _ in range(4)])


def _pp_save(comm: Any, directory: str) -> None:
    stages = [nn.Sequential(*list(_pp_model(0).modules)[2 * r:2 * r + 2]) for r in range(2)]
    save_stage(stages[comm.rank], 2 * comm.rank, comm, directory)


def _pp_load(directory: str) -> Dict[str, np.ndarray]:
    model = _pp_model(1)
    load_stage(model, 0, directory)  # the whole model on one stage: reads both files
    return model.state_dict()


def _tp_model(comm: Any, seed: int) -> ColumnParallelLinear:
    np.random.seed(seed)
    return ColumnParallelLinear(4, 6, comm, dtype="float64")


def _tp_save(comm: Any, directory: str) -> None:
    tp_state.save_sharded(_tp_model(comm, 3), comm, directory)


def _tp_rank(comm: Any, directory: str) -> Any:
    m = _tp_model(comm, 4)  # tp=2 saved, tp=1 loads: the shards are concatenated
    try:
        tp_state.load_sharded(m, comm, directory)
    except Exception as err:  # handed back to be judged, not wrapped by the virtual cluster
        return err
    return m.state_dict()


def _tp_load(directory: str) -> Dict[str, np.ndarray]:
    (out,) = virtual.run(1, _tp_rank, directory)
    if isinstance(out, Exception):
        raise out
    return out


def _fsdp(comm: Any) -> Any:
    from needle.parallel import FullyShardedDataParallel
    np.random.seed(4)
    return FullyShardedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), comm)


def _fsdp_save(comm: Any, directory: str) -> None:
    _fsdp(comm).save_sharded(directory)


def _fsdp_rank(comm: Any, directory: str) -> Any:
    fsdp = _fsdp(comm)
    try:
        fsdp.load_sharded(directory)
    except Exception as err:  # handed back to be judged, not wrapped by the virtual cluster
        return err
    return [u.shard.numpy() for u in fsdp.units]


def _fsdp_load(directory: str) -> List[Any]:
    out = virtual.run(2, _fsdp_rank, directory)
    for r in out:
        if isinstance(r, Exception):
            raise r
    return out


FORMATS = {"pipeline": ("pipeline.json", _pp_save, _pp_load),
           "tp": ("index.json", _tp_save, _tp_load),
           "fsdp": ("index.json", _fsdp_save, _fsdp_load)}
MANIFEST_EDITS = ["manifest bytes", "manifest field", "forged manifest", "shard bytes",
                  "shards swapped", "shard symlinked out"]


def manifest_case(fmt: str, pristine: str, work: str, want: Any,
                  rng: random.Random) -> Tuple[str, Outcome]:
    """One corrupted or forged sharded checkpoint (a fresh copy of ``pristine``) and its load."""
    name, _, load = FORMATS[fmt]
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work, symlinks=True)
    index = os.path.join(work, name)
    shards = sorted(f for f in os.listdir(work) if f.endswith(".ndl"))
    kind = rng.choice(MANIFEST_EDITS)
    if kind in ("manifest field", "forged manifest"):
        with open(index) as f:
            doc = edit_json(json.load(f), rng)
        if kind == "forged manifest" and isinstance(doc, dict):
            doc["crc32"] = manifest._crc(doc)
        with open(index, "w") as f:
            json.dump(doc, f)
    elif kind in ("manifest bytes", "shard bytes"):
        target = index if kind == "manifest bytes" else os.path.join(work, rng.choice(shards))
        with open(target, "rb") as f:
            raw = f.read()
        with open(target, "wb") as f:
            f.write(rng.choice(BYTE_EDITS)(raw, rng))
    elif kind == "shards swapped":
        a, b = (os.path.join(work, s) for s in shards[:2])
        os.replace(a, a + ".x")
        os.replace(b, a)
        os.replace(a + ".x", b)
    else:
        victim = os.path.join(work, rng.choice(shards))
        outside = work + ".outside"
        os.replace(victim, outside)
        os.symlink(outside, victim)
    return f"{fmt} {kind}", judge(lambda: load(work), want, kind == "forged manifest")


# ------------------------------------------------------------------------ driver
def run(cases: int, seed: int, folder: str) -> Dict[str, Any]:
    """Run ``cases`` seeded cases (half ndl.load, half manifests); counts per kind and outcome."""
    rng = random.Random(seed)
    obj, path = reference(), os.path.join(folder, "ref.ndl")
    ndl.save(obj, path)
    with open(path, "rb") as f:
        good = f.read()
    want = ndl.load(path)
    pristine, wants = {}, {}
    for fmt, (_, save, load) in FORMATS.items():
        pristine[fmt] = os.path.join(folder, fmt)
        virtual.run(2, save, pristine[fmt])
        wants[fmt] = load(pristine[fmt])
    counts: Dict[str, Dict[str, int]] = {}
    failures = []
    for i in range(cases):
        if i % 2 == 0:
            what, (outcome, detail) = load_case(good, want, os.path.join(folder, "c.ndl"), rng)
        else:
            fmt = rng.choice(sorted(FORMATS))
            what, (outcome, detail) = manifest_case(fmt, pristine[fmt],
                                                    os.path.join(folder, "work"), wants[fmt], rng)
        row = counts.setdefault(what, {})
        row[outcome] = row.get(outcome, 0) + 1
        if outcome == "FAIL":
            failures.append({"case": i, "what": what, "detail": detail})
    total: Dict[str, int] = {}
    for row in counts.values():
        for k, v in row.items():
            total[k] = total.get(k, 0) + v
    return {"cases": cases, "seed": seed, "total": total, "by_kind": counts,
            "failures": failures}


def main(argv: List[str]) -> int:
    """Run the fuzz and print its counts (or JSON); status 1 if any case failed."""
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=cli.count_type(lo=1), default=2000)
    parser.add_argument("--seed", type=cli.count_type(lo=0, hi=2**32 - 1), default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="needle-fuzz-") as folder:
        result = run(args.cases, args.seed, folder)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['cases']} cases, seed {result['seed']}: {result['total']}")
        for what, row in sorted(result["by_kind"].items()):
            print(f"  {what:36s} {row}")
        for fail in result["failures"][:20]:
            print(f"FAIL case {fail['case']} ({fail['what']}): {fail['detail']}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
