"""Bad input fails early with a ValueError/TypeError whose message names what is wrong."""
import re
from typing import Any, Callable

import numpy as np
import pytest

import needle as ndl
import needle.backend_ndarray as nd
from needle import numbers
from needle.backend_ndarray import BackendDevice, ndarray_backend_numpy

# a second CPU device (same backend module, different name): arrays on it must not mix with cpu()
CPU2 = BackendDevice("cpu2", ndarray_backend_numpy)


def T(shape: Any, device: Any = None, dtype: str = "float32") -> ndl.Tensor:
    """A tensor of ones."""
    return ndl.Tensor(np.ones(shape), device=device, dtype=dtype)


def raises_naming(exc: Any, fn: Callable[[], Any], *names: str) -> None:
    """``fn()`` raises ``exc`` and its message contains every one of ``names``."""
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for name in names:
        assert name in msg, f"{name!r} not in message {msg!r}"


# ---------------------------------------------------------------------- shapes
@pytest.mark.parametrize("fn,names", [
    (lambda: T((2, 3)) + T((4,)), ["(2, 3)", "(4,)"]),
    (lambda: T((2, 3)) * T((3, 2)), ["(2, 3)", "(3, 2)"]),
    (lambda: ndl.ops.maximum(T((2, 3)), T((2,))), ["(2, 3)", "(2,)"]),
    (lambda: T((2, 3)) @ T((4, 2)), ["(2, 3)", "(4, 2)"]),
    (lambda: T((5, 2, 3)) @ T((4, 3, 2)), ["(5, 2, 3)", "(4, 3, 2)"]),
    (lambda: T((3,)) @ T((3, 2)), ["(3,)", "(3, 2)"]),
    (lambda: T((2, 3)).reshape((4, 2)), ["(2, 3)", "(4, 2)"]),
    (lambda: T((2, 3)).reshape((-1, 4)), ["(2, 3)", "(-1, 4)"]),
    (lambda: T((2, 3)).broadcast_to((4, 2)), ["(2, 3)", "(4, 2)"]),
    (lambda: T((2, 3)).broadcast_to((3,)), ["(2, 3)", "(3,)"]),
    (lambda: ndl.ops.conv(T((1, 4, 4, 3)), T((3, 3, 2, 4))), ["(3, 3, 2, 4)", "3 channels"]),
    (lambda: ndl.ops.conv(T((4, 4, 3)), T((3, 3, 3, 4))), ["(4, 4, 3)", "(3, 3, 3, 4)"]),
    (lambda: ndl.ops.stack([T((2, 3)), T((3, 2))], 0), ["(3, 2)", "(2, 3)"]),
    (lambda: ndl.ops.where(np.ones((2, 2), dtype=bool), T((2, 3)), T((2, 3))),
     ["(2, 2)", "(2, 3)"]),
    (lambda: T((2, 3)).backward(T((3,))), ["(3,)", "(2, 3)"]),
], ids=["add", "multiply", "maximum", "matmul", "matmul-batch", "matmul-1d", "reshape",
        "reshape-1", "broadcast_to", "broadcast_to-fewer-dims", "conv-channels", "conv-ndim",
        "stack", "where", "backward-out_grad"])
def test_shape_mismatch_names_shapes(fn: Callable[[], Any], names: Any) -> None:
    raises_naming(ValueError, fn, *names)


def test_setitem_shape_mismatch_names_shapes() -> None:
    a = nd.array(np.zeros((4, 5)))
    raises_naming(ValueError, lambda: a.__setitem__((slice(0, 2),), nd.array(np.ones((3, 5)))),
                  "(3, 5)", "(2, 5)")


def test_index_out_of_range_names_axis_and_size() -> None:
    a = nd.array(np.zeros((4, 5)))
    raises_naming(IndexError, lambda: a[0, 5], "5", "axis 1", "size 5")
    raises_naming(IndexError, lambda: a[0, 0, 0], "(4, 5)")
    raises_naming(TypeError, lambda: a[0.5], "float")


# ---------------------------------------------------------------------- axes
@pytest.mark.parametrize("fn,names", [
    (lambda: ndl.ops.summation(T((2, 3)), axes=(0, 5)), ["axis 5", "2 dimensions"]),
    (lambda: ndl.ops.summation(T((2, 3)), axes=-3), ["axis -3", "2 dimensions"]),
    (lambda: ndl.ops.max(T((2, 3)), axes=2), ["axis 2", "2 dimensions"]),
    (lambda: ndl.ops.logsumexp(T((2, 3)), axes=(3,)), ["axis 3", "2 dimensions"]),
    (lambda: ndl.ops.logsoftmax(T((2, 3)), axis=2), ["axis 2", "2 dimensions"]),
    (lambda: ndl.ops.transpose(T((2, 3)), axes=(0, 5)), ["(0, 5)", "(2, 3)"]),
    (lambda: ndl.ops.transpose(T((2, 3)), axes=(0, 1, 2)), ["(0, 1, 2)"]),
    (lambda: ndl.ops.split(T((2, 3)), 3), ["axis 3", "(2, 3)"]),
    (lambda: ndl.ops.flip(T((2, 3)), (2,)), ["axis 2", "2 dimensions"]),
    (lambda: nd.array(np.ones((2, 3))).permute((0, 0)), ["(0, 0)", "(2, 3)"]),
    (lambda: nd.array(np.ones((2, 3))).permute((0, 2)), ["axis 2", "2 dimensions"]),
    (lambda: nd.array(np.ones((2, 3))).sum(axis=(0, 0)), ["repeated", "(0, 0)"]),
], ids=["summation", "summation-negative", "max", "logsumexp", "logsoftmax", "transpose",
        "transpose-3-axes", "split", "flip", "permute-repeated", "permute-range", "sum-repeated"])
def test_bad_axes_name_the_axes(fn: Callable[[], Any], names: Any) -> None:
    raises_naming(ValueError, fn, *names)


def test_non_int_axis_is_a_type_error() -> None:
    raises_naming(TypeError, lambda: nd.array(np.ones((2, 3))).sum(axis=1.5), "1.5")


# ---------------------------------------------------------------------- dtypes
def test_unknown_dtype_names_it() -> None:
    raises_naming(TypeError, lambda: ndl.Tensor([1.0], dtype="complex64"), "complex64",
                  "float32")
    raises_naming(TypeError, lambda: nd.array([1.0], dtype="float128x"), "float128x")
    raises_naming(TypeError, lambda: nd.array([1.0]).astype("complex128"), "complex128")


def test_data_setter_dtype_mismatch_names_dtypes() -> None:
    x = T((2,), dtype="float32")
    with pytest.raises(TypeError, match=re.escape("float64") + ".*" + re.escape("float32")):
        x.data = T((2,), dtype="float64")
    raises_naming(TypeError, lambda: setattr(x, "data", np.ones(2)), "ndarray")


def test_unsupported_operands_name_the_type() -> None:
    a = nd.array(np.ones(3))
    raises_naming(TypeError, lambda: a + "x", "str")
    raises_naming(TypeError, lambda: a @ np.ones((3, 1)), "ndarray")
    raises_naming(TypeError, lambda: T((2,)).backward(np.ones(2)), "ndarray")
    raises_naming(TypeError, lambda: T((3,))[[0, 1]], "ints, slices")


# ---------------------------------------------------------------------- devices
@pytest.mark.parametrize("fn", [
    lambda: T((2, 3)) + T((2, 3), device=CPU2),
    lambda: T((2, 3)) * T((2, 3), device=CPU2),
    lambda: T((2, 3)) @ T((3, 2), device=CPU2),
    lambda: ndl.ops.maximum(T((2, 3), device=CPU2), T((2, 3))),
    lambda: ndl.ops.stack([T((2, 3)), T((2, 3), device=CPU2)], 0),
    lambda: ndl.ops.where(np.ones((2, 3), dtype=bool), T((2, 3)), T((2, 3), device=CPU2)),
    lambda: ndl.ops.conv(T((1, 4, 4, 3)), T((3, 3, 3, 2), device=CPU2)),
    lambda: nd.array(np.ones(2)).__setitem__(slice(None), nd.array(np.ones(2), device=CPU2)),
], ids=["add", "multiply", "matmul", "maximum", "stack", "where", "conv", "setitem"])
def test_device_mismatch_names_devices(fn: Callable[[], Any]) -> None:
    raises_naming(ValueError, fn, "cpu()", "cpu2()")


def test_same_device_name_does_not_raise_and_to_moves() -> None:
    x = T((2,), device=CPU2)
    assert x.device == CPU2 and x.device != ndl.cpu()
    y = x.to(ndl.cpu()) + T((2,))
    np.testing.assert_array_equal(y.numpy(), [2.0, 2.0])
    assert y.device == ndl.cpu()


def test_disabled_cuda_device_is_refused() -> None:
    disabled = BackendDevice("cuda", None, 5)  # what ndl.cuda(i) is without a GPU or emulator
    raises_naming(RuntimeError, lambda: ndl.Tensor([1.0], device=disabled), "cuda(5)")


# ---------------------------------------------------------------------- numbers at a door
@pytest.mark.parametrize("call,words", [
    (lambda: numbers.count("\u0663", "slots", lo=1), "slots '\u0663' must be a whole number >= 1"),
    (lambda: numbers.count("\u00b2", "slots"), "(ASCII digits)"),
    (lambda: numbers.count("1.5", "--n"), "--n '1.5' must be a whole number"),
    (lambda: numbers.count("1e3", "--n"), "--n '1e3'"),
    (lambda: numbers.count(2.5, "batch_size", lo=1), "batch_size 2.5 must be a whole number >= 1"),
    (lambda: numbers.count(float("nan"), "n"), "n nan must be a whole number"),
    (lambda: numbers.count(True, "n"), "(got a bool)"),
    (lambda: numbers.count(9, "n", lo=1, hi=8), "n 9 must be a whole number in [1, 8]"),
    (lambda: numbers.count(-1, "limit", lo=0), "limit -1 must be a whole number >= 0"),
    (lambda: numbers.positive("nan", "--lr"), "--lr 'nan' must be a finite number > 0"),
    (lambda: numbers.positive(float("inf"), "lr"), "lr inf must be a finite number > 0"),
    (lambda: numbers.positive(0, "timeout"), "timeout 0 must be a finite number > 0"),
    (lambda: numbers.fraction(1.0, "p"), "p 1.0 must be a finite number in [0, 1)"),
    (lambda: numbers.fraction("-0.1", "p"), "p '-0.1' must be a finite number in [0, 1)"),
    (lambda: numbers.real("x", "--f"), "--f 'x' must be a finite number"),
], ids=["arabic-indic", "superscript", "decimal", "exponent", "fraction", "nan", "bool", "above",
        "negative", "nan-rate", "inf-rate", "zero-timeout", "fraction-1", "fraction-neg", "word"])
def test_numbers_name_input_value_and_rule(call: Callable[[], Any], words: str) -> None:
    raises_naming(numbers.NumberError, call, words)


def test_numbers_accept_what_they_should() -> None:
    assert numbers.count(" 12 ", "n") == 12 and numbers.count(np.int64(3), "n", lo=1) == 3
    assert numbers.count(4.0, "n") == 4 and numbers.count("-2", "n", lo=None) == -2
    assert numbers.positive("1e-3", "lr") == 1e-3 and numbers.fraction(0, "p") == 0.0


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "0"])
def test_a_bad_emulator_device_count_is_named_not_read_as_no_gpu(value: str) -> None:
    """It once ended as "device cuda(0) is not enabled": the setting's error was swallowed."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, NEEDLE_CUDA_EMULATOR="1", NEEDLE_CUDA_EMULATOR_DEVICES=value)
    code = ("import numpy as np, needle as ndl\n"
            "from needle.parallel import devices\n"
            "devices.device_for('cuda', 0)\n")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: NEEDLE_CUDA_EMULATOR_DEVICES=") and repr(value) in last, \
        res.stderr


def test_save_into_a_missing_or_wrong_folder_names_it_not_a_temporary_file(tmp_path: Any) -> None:
    state = {"w": T((2,))}
    missing = tmp_path / "nope" / "model.ndl"
    with pytest.raises(FileNotFoundError) as info:
        ndl.save(state, str(missing))
    assert str(info.value).endswith(f"cannot write {missing}: the folder {missing.parent} does "
                                    "not exist") and ".ndltmp" not in str(info.value)
    (tmp_path / "file").write_text("")
    raises_naming(NotADirectoryError, lambda: ndl.save(state, str(tmp_path / "file" / "m.ndl")),
                  f"{tmp_path / 'file'} is not a folder")
    raises_naming(IsADirectoryError, lambda: ndl.save(state, str(tmp_path)), "it is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    raises_naming(IsADirectoryError, lambda: ndl.load(str(tmp_path)),
                  f"ndl.load: {tmp_path} is a folder, not a checkpoint file")
