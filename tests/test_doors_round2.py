"""A fresh probe of the public API with hostile input (issue 43, round two): each case once
returned a silently wrong answer, crashed with an exception naming no argument (deep in NumPy,
Python's own TypeError or AttributeError), or ran for ever. Each now raises at the door, naming
the argument and the rule."""
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import needle as ndl
from needle import data, init, nn, optim
from needle.parallel import RankFailedError, input_agreement, virtual

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


def P(shape: Any = (2, 3), dtype: str = "float32", device: Any = None) -> nn.Parameter:
    return nn.Parameter(ndl.Tensor(np.ones(shape), dtype=dtype, device=device))


def _stepped(opt: Any, grad: ndl.Tensor) -> None:
    """One step of ``opt`` (over one parameter) with ``grad``."""
    opt.params[0].grad = grad
    opt.step()


def _agree(fields_of: Callable[[int], Any]) -> Any:
    return virtual.run(2, lambda c: input_agreement.agree_inputs(c, "probe", fields_of(c.rank),
                                                                 "probe"), timeout=60)


def _graph(g: Any, **kw: Any) -> Any:
    if not ndl.cuda().enabled():
        pytest.skip("needs the (emulated) CUDA device")
    from needle.backend_cuda import graphs
    return graphs.graph(graphs.CUDAGraph() if g is None else g, **kw).__enter__()


def _int_state_loaded() -> None:
    p = P()
    opt = optim.Adam([p], lr=0.1)
    _stepped(opt, ndl.Tensor(np.ones((2, 3)), dtype="float32"))
    state = opt.state_dict()
    state["state"]["0"]["m"] = state["state"]["0"]["m"].astype(np.int64)  # 0.1 -> 0
    optim.Adam([P()], lr=0.1).load_state_dict(state)


def _step_loaded(step: Any) -> None:
    opt = optim.Adafactor([P()])
    _stepped(opt, ndl.Tensor(np.ones((2, 3)), dtype="float32"))
    state = opt.state_dict()
    state["state"]["0"]["step"] = step
    optim.Adafactor([P()]).load_state_dict(state)


# (what was wrong before, the call, the exception, words the message must hold)
CASES = [
    # ---- silent wrong answers
    ("kaiming_uniform(2.5, 3): a fan_in of 2.5 would be taken as 2",
     lambda: init.kaiming_uniform(2.5, 3), ValueError,
     "initializer fan_in 2.5 must be a whole number >= 1"),
    ("compile(fusion='no') fused: the string is truthy",
     lambda: ndl.compile(lambda x: x, fusion="no"), TypeError,
     "needle.compile: fusion must be True or False, got 'no'"),
    ("graph(g, device_index='0') captured on device 0",
     lambda: _graph(None, device_index="0"), ValueError,
     "graph: device_index '0' must be a whole number >= 0, not a str"),
    ("Adam stepped a CPU parameter with a gradient held on the GPU",
     lambda: _stepped(optim.Adam([P()], lr=0.1),
                      ndl.Tensor(np.ones((2, 3)), dtype="float32", device=ndl.cuda())),
     ValueError, "param 0: grad on cuda(0"),
    ("Adam on an int64 parameter: every step rounded to 0",
     lambda: _stepped(optim.Adam([P(dtype="int64")], lr=0.1),
                      ndl.Tensor(np.ones((2, 3)), dtype="int64")),
     TypeError, "param 0: a int64 parameter cannot be stepped"),
    ("Adam.load_state_dict took an int64 first moment (0.1 became 0)", _int_state_loaded,
     ValueError, "optimizer state 'm' of param 0 has dtype int64; expected a float dtype"),
    ("pack([1, 2], [3]): zip dropped the second value", lambda: input_agreement.pack([1, 2], [3]),
     ValueError, "pack: 2 values but 1 widths"),
    ("unpack(1, [0]) gave [0]: a width of 0 holds nothing", lambda: input_agreement.unpack(1, [0]),
     ValueError, "unpack: widths in bits must be >= 1, got [0]"),
    ("Adafactor.load_state_dict took a step count of 1.5", lambda: _step_loaded(1.5), ValueError,
     "optimizer state 'step' of param 0 1.5 must be a whole number >= 0"),
    ("pack([1.5], [4]) packed 1", lambda: input_agreement.pack([1.5], [4]), TypeError,
     "pack: a value must be an integer, got float 1.5"),
    ("unpack(-1, [4]) gave [15]", lambda: input_agreement.unpack(-1, [4]), ValueError,
     "unpack: a context is >= 0, got -1"),
    ("agree_inputs: widths 1.2 and 1.4 agreed (both int() to 1)",
     lambda: _agree(lambda r: {"w": 1.2 + 0.2 * r}), RankFailedError,
     "probe: input 'w' must be an integer, got float 1.2"),
    ("ndl.load(verify='no') verified: the string is truthy",
     lambda: ndl.load("x.ndl", verify="no"), TypeError,
     "ndl.load: verify must be True or False, got 'no'"),
    ("read_idx(max_bytes=nan) read without a bound",
     lambda: data.read_idx("x.gz", max_bytes=NAN), ValueError,
     "read_idx: max_bytes nan must be a whole number >= 0"),
    # ---- crashes naming nothing
    ("graph('g'): AttributeError 'reset'", lambda: _graph("g"), TypeError,
     "graph: expected a CUDAGraph to capture into, got str"),
    ("Adam(3): 'int' object is not iterable", lambda: optim.Adam(3), TypeError,
     "Adam: params must be an iterable of Tensors, got int"),
    ("load_state_dict(None): 'NoneType' object is not iterable",
     lambda: optim.SGD([P()]).load_state_dict(None), TypeError,
     "optimizer state_dict must be a dict, got NoneType"),
    ("pack([1], [2.5]): unsupported operand for <<", lambda: input_agreement.pack([1], [2.5]),
     TypeError, "pack: a width in bits must be an integer, got float 2.5"),
    ("pack([nan], [4]): cannot convert float NaN to integer",
     lambda: input_agreement.pack([NAN], [4]), TypeError, "pack: a value must be an integer"),
    ("checksum(None): NumPy's 'Cannot change data-type for array of references'",
     lambda: input_agreement.checksum(None), TypeError,
     "checksum: expected an array of numbers, got NoneType"),
    ("agree_inputs(fields=[1, 2]): IndexError", lambda: _agree(lambda r: [1, 2]),
     RankFailedError, "agree_inputs: fields must be a dict of name -> int, got list"),
    ("ndl.save to a path with a NUL byte: 'embedded null byte'",
     lambda: ndl.save({"a": 1}, "a\0b"), ValueError, "ndl.save: the path 'a\\x00b' holds a NUL"),
    ("parse_mnist(None, ...): stat: path should be string", lambda: data.parse_mnist(None, "x"),
     TypeError, "MNIST: a file name is a str, got NoneType"),
    ("MNISTDataset(transforms=3): 'int' object is not iterable at the first sample",
     lambda: data.MNISTDataset("x.gz", "y.gz", transforms=3), TypeError,
     "MNISTDataset: transforms must be a list of callables (x -> x), got 3"),
    ("MNISTDataset(transforms=[3]): 'int' object is not callable at the first sample",
     lambda: data.MNISTDataset("x.gz", "y.gz", transforms=[3]), TypeError,
     "MNISTDataset: transforms must be a list of callables"),
]


@pytest.mark.parametrize("why, call, exc, words", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_refused_at_the_door(why: str, call: Callable[[], Any], exc: type,
                                          words: str) -> None:
    if "cuda" in why.lower() + words and not ndl.cuda().enabled():
        pytest.skip("needs the (emulated) CUDA device")
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), f"{why}: {info.value!r}"


def test_an_empty_exercise_id_is_refused_before_grading_everything() -> None:
    """`--exercise ''` once picked nothing, so pytest collected the whole suite (ran for many
    minutes: a hang to the user); now one line, at once."""
    res = subprocess.run([sys.executable, "-m", "course.grade", "--exercise", ""], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res.stdout[-2000:]
    assert "--exercise '': give an exercise id or prefix" in res.stderr


def test_running_the_strategy_library_says_which_command_runs_it() -> None:
    """`python -m apps.data_parallel_strategies --strategy ddp` once ran nothing and exited 0."""
    res = subprocess.run([sys.executable, "-m", "apps.data_parallel_strategies", "--strategy",
                          "ddp"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 1 and "python -m apps.train_parallel --strategy" in res.stderr


@pytest.mark.parametrize("value", ["slow", "fast course"])
def test_a_bad_reduce_setting_is_named_not_read_as_no_gpu(value: str) -> None:
    """NEEDLE_CUDA_REDUCE=slow once ended as "device cuda(0) is not enabled": the backend's
    loader took the setting's ValueError for a missing GPU."""
    env = dict(os.environ, NEEDLE_CUDA_EMULATOR="1", NEEDLE_CUDA_REDUCE=value)
    code = "import needle as ndl\nndl.cuda().enabled() or print('disabled')\n"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode != 0, res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: NEEDLE_CUDA_REDUCE={value.lower()!r}"), res.stderr


@pytest.mark.parametrize("cls", [optim.Adafactor, optim.Adam, optim.SGD])
@pytest.mark.parametrize("shape", [(2, 3), (4,), (2, 2, 3)])
def test_an_optimizers_own_state_dict_loads_and_steps_as_it_would_have(cls: Any,
                                                                        shape: Any) -> None:
    """Adafactor's factored moments ('row' (..., n, 1), 'col' (..., 1, m)) were refused by the
    load's shape check ('has shape (2, 1), param has (2, 3)'): its own state_dict never loaded."""
    rng = np.random.default_rng(0)
    kw = {"momentum": 0.9} if cls is optim.SGD else {}
    g1, g2 = rng.standard_normal(shape), rng.standard_normal(shape)
    p = nn.Parameter(ndl.Tensor(rng.standard_normal(shape), dtype="float32"))
    opt = cls([p], lr=0.1, **kw)
    _stepped(opt, ndl.Tensor(g1, dtype="float32"))
    q = nn.Parameter(ndl.Tensor(p.numpy(), dtype="float32"))
    again = cls([q], lr=0.1, **kw)
    again.load_state_dict(opt.state_dict())
    _stepped(again, ndl.Tensor(g2, dtype="float32"))
    _stepped(opt, ndl.Tensor(g2, dtype="float32"))
    np.testing.assert_array_equal(q.numpy(), p.numpy())


def test_what_the_round2_doors_still_accept() -> None:
    """NumPy integers as packed values and widths, a tuple of transforms, a bytes-free path."""
    assert input_agreement.unpack(input_agreement.pack([np.int64(3), 5], (4, np.int32(4))),
                                  [4, 4]) == [3, 5]
    assert _agree(lambda r: {"w": np.int64(7)}) == [None, None]
    ds = data.NDArrayDataset(np.ones((2, 3)))
    assert ds.transforms is None


def test_an_output_folder_that_cannot_be_made_is_named_before_the_run(tmp_path: Path) -> None:
    """/proc takes no new folder even for root (whom os.access lets write anywhere): the
    check tries one (made and removed), so --profile /proc/nope is refused up front."""
    from needle.cli import check_output_dir
    if os.path.isdir("/proc"):
        said = check_output_dir("/proc/nope", "--profile")
        assert said is not None and said.startswith("--profile /proc/nope cannot be"), said
    assert check_output_dir(str(tmp_path / "a" / "b"), "--profile") is None
    assert list(tmp_path.iterdir()) == []  # the check leaves nothing behind


@pytest.mark.parametrize("index", [1.5, "a", np.array([0.0, 1.0])])
def test_a_dataset_index_that_is_not_whole_is_named(index: Any) -> None:
    ds = data.MNISTDataset.__new__(data.MNISTDataset)  # the images as parsed, no files needed
    ds.images, ds.labels, ds.transforms = np.zeros((5, 784), np.float32), np.arange(5), None
    with pytest.raises(TypeError, match="MNISTDataset index must be a whole number"):
        ds[index]
    assert ds[np.array([0, 1])][0].shape == (2, 784) and ds[3][0].shape == (784,)
    assert ds[1:3][0].shape == (2, 784)


@pytest.mark.parametrize("args", [["/dev/null"], []])
def test_the_planners_pingpong_worker_run_by_hand_says_how_to_run_it(args: Any) -> None:
    res = subprocess.run([sys.executable, "-m", "needle.plan.measure.pingpong", *args],
                         capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 1 and "mpiexec -n 2" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW, optim.Adafactor])
def test_an_optimizer_of_no_parameters_is_refused(cls: Any) -> None:
    """A step that updates nothing trained nothing and said nothing (PyTorch refuses too)."""
    with pytest.raises(ValueError, match=f"{cls.__name__}: got an empty parameter list"):
        cls(nn.ReLU().parameters())


def test_internal_helpers_name_what_they_were_given() -> None:
    """The last of the round-2 probe: a value that is no rank list, no communicator, and
    multi-tensor lists of different lengths (zip dropped the tail: those tensors never
    stepped) or a slot outside the state's."""
    from needle.backend_ndarray import fused_ops as F
    with pytest.raises(TypeError, match="by_rank: values must be a sequence"):
        input_agreement.by_rank(3)
    with pytest.raises(TypeError, match="agree_inputs: comm must be a communicator"):
        input_agreement.agree_inputs(None, "x", {"a": 1}, "lbl")
    ps = [ndl.NDArray(np.zeros(3, np.float32)) for _ in range(2)]
    zeros = [ndl.NDArray(np.zeros(3, np.float32)) for _ in range(2)]
    state = F.MultiTensorState(ndl.cpu(), 2)
    with pytest.raises(ValueError, match="one entry per tensor, got lengths"):
        F.multi_tensor_adam(ps, ps[:1], zeros, zeros, [0, 1], [1, 1], state, 0.1)
    with pytest.raises(ValueError, match=r"slots must lie in 0\.\.1, got 0\.\.2"):
        F.multi_tensor_adam(ps, ps, zeros, zeros, [0, 2], [1, 1], state, 0.1)
