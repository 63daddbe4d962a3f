"""FlatLayout: tensors back to back in one vector, padded to equal parts (expected by hand)."""
import numpy as np

from needle.parallel.data_parallel.flat_layout import FlatLayout, chunk_cols


def test_offsets_padding_and_parts():
    lay = FlatLayout([(2, 3), (), (4,)], parts=4)  # 6 + 1 + 4 = 11 elements -> 4 parts of 3
    assert lay.sizes == [6, 1, 4] and lay.offsets == [0, 6, 7]
    assert lay.numel == 11 and lay.cols == 3
    a, s, b = np.arange(6.0).reshape(2, 3), np.array(-1.0), np.array([10.0, 11, 12, 13])
    flat = lay.flatten([a, s, b], np.float64)
    assert flat.shape == (12,)
    np.testing.assert_array_equal(flat, [0, 1, 2, 3, 4, 5, -1, 10, 11, 12, 13, 0])
    np.testing.assert_array_equal(lay.part(flat, 2), [-1, 10, 11])
    np.testing.assert_array_equal(lay.part(flat, 3), [12, 13, 0])  # padding at the end


def test_views_share_memory_and_keep_shapes():
    lay = FlatLayout([(2, 2), (3,)], parts=2)
    flat = np.arange(8.0)
    views = lay.views(flat)
    assert [v.shape for v in views] == [(2, 2), (3,)]
    views[1][0] = 99.0
    assert flat[4] == 99.0
    np.testing.assert_array_equal(views[0], [[0, 1], [2, 3]])


def test_chunk_cols_rounds_up_and_an_empty_layout_is_empty():
    assert [chunk_cols(n, 3) for n in (0, 1, 3, 4, 7)] == [0, 1, 1, 2, 3]
    lay = FlatLayout([], parts=2)
    assert lay.offsets == [] and lay.numel == 0 and lay.flatten([], np.float32).shape == (0,)
