"""ndl.load's checks at their edges: a table entry whose shape disagrees with its byte count, a
file one byte short, and keys ndl.save must refuse (a bool is an int to isinstance)."""
import json
import struct

import numpy as np
import pytest

import needle as ndl
from needle import serialization


def _rewrite_entry(path, **fields):
    """Change array 0's table entry and recompute the header checksum, as a hostile or buggy
    writer would: only the checks behind the checksum can catch it."""
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[8:16])
    header = json.loads(raw[16:16 + hlen])
    header["arrays"][0].update(fields)
    header["crc32"] = serialization._header_crc(header["tree"], header["arrays"])
    new = json.dumps(header).encode()
    path.write_bytes(raw[:8] + struct.pack("<Q", len(new)) + new + raw[16 + hlen:])


def test_shape_that_disagrees_with_the_byte_count_is_refused(tmp_path):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(6.0)}, path)
    _rewrite_entry(path, shape=[2, 2])  # 4 float64 = 32 bytes, the entry says 48
    with pytest.raises(serialization.CheckpointError, match=r"shape \[2, 2\] x float64 != 48"):
        ndl.load(path)


def test_a_file_one_byte_short_is_refused(tmp_path):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(6.0)}, path)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(serialization.CheckpointError, match="runs past the end of the file"):
        ndl.load(path)


def test_a_header_one_byte_longer_than_the_file_is_refused_by_its_length(tmp_path):
    path = tmp_path / "c.ndl"
    ndl.save({"w": np.arange(6.0)}, path)
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[8:16])
    path.write_bytes(raw[:16 + hlen - 1])  # the header's last byte is missing
    with pytest.raises(serialization.CheckpointError, match=f"header length {hlen} exceeds"):
        ndl.load(path)


@pytest.mark.parametrize("key", [True, False, 1.5, None])
def test_keys_other_than_str_or_int_are_refused(tmp_path, key):
    with pytest.raises(TypeError, match="dict keys must be str or int"):
        ndl.save({key: 1}, tmp_path / "k.ndl")
