"""A second probe of the public API with hostile input (issue 43): each case once crashed deep
inside NumPy, raised an AttributeError or IndexError from needle's own internals, or returned a
silently wrong answer. Each now raises at the door, naming the argument, the value and the rule.
"""
from typing import Any, Callable

import numpy as np
import pytest

import needle as ndl
from needle import amp, data, init, memory, metrics, nn, ops, optim, profiler, quant
from needle.parallel import FullyShardedDataParallel, ParameterServer, RankFailedError, virtual
from needle.parallel.pipeline import PipelineParallel

NAN = float("nan")


def T(shape: Any, dtype: str = "float32") -> ndl.Tensor:
    return ndl.Tensor(np.ones(shape), dtype=dtype)


def I(shape: Any) -> ndl.Tensor:  # noqa: E743 (an integer tensor of ones)
    return T(shape, "int64")


# (what was wrong before, the call, the exception, words the message must hold)
CASES = [
    # ---- tensors: silent wrong values
    ("uint64 2**63 became -2**63", lambda: ndl.Tensor(np.array([2**63], np.uint64)),
     ValueError, "uint64 values in [9223372036854775808, 9223372036854775808] do not fit int64"),
    ("nan became int64 -2**63", lambda: ndl.Tensor(np.array([NAN]), dtype="int64"),
     ValueError, "cannot convert float64 nan or inf to int64"),
    ("300 became uint8 44", lambda: ndl.Tensor(np.array([300]), dtype="uint8"),
     ValueError, "do not fit uint8 ([0, 255])"),
    ("None became nan", lambda: ndl.Tensor(None), TypeError, "cannot make an array of None"),
    ("reshape('6') read the characters", lambda: T((2, 3)).reshape("6"),
     ValueError, "reshape: size '6' must be a whole number >= -1, not a str"),
    ("reshape((True, 6)) read True as 1", lambda: T((2, 3)).reshape((True, 6)),
     ValueError, "reshape: size True must be a whole number >= -1 (got a bool)"),
    ("reshape((1.5, 6)) ran as (1, 6)", lambda: T((1, 6)).reshape((1.5, 6)),
     ValueError, "reshape: size 1.5 must be a whole number >= -1"),
    ("broadcast_to((-1, 3)) made a tensor that failed when read",
     lambda: T((1, 3)).broadcast_to((-1, 3)), ValueError,
     "broadcast_to: size -1 must be a whole number >= 0"),
    # ---- tensors: AttributeError / IndexError / deep NumPy errors
    ("device='cpu': AttributeError 'enabled'", lambda: ndl.Tensor([1.0], device="cpu"),
     TypeError, "device must be a needle BackendDevice (ndl.cpu(), ndl.cuda()), got str 'cpu'"),
    ("a NumPy array into a layer: AttributeError 'requires_grad'",
     lambda: nn.ReLU()(np.ones(3)), TypeError, "input 0 is ndarray, not a needle Tensor"),
    ("stack of a Tensor and an array: AttributeError 'cached_data'",
     lambda: ops.stack([T((2,)), np.ones(2)], 0), TypeError, "input 1 is ndarray"),
    ("broadcast_to((2.5, 3)): deep in NumPy", lambda: T((1, 3)).broadcast_to((2.5, 3)),
     ValueError, "broadcast_to: size 2.5"),
    ("reshape(None): int * None", lambda: T((2, 3)).reshape(None),
     ValueError, "reshape: size None must be a whole number"),
    ("pad by 0.5: deep in NumPy", lambda: ops.pad(T((2, 3)), ((0.5, 0), (0, 0))),
     ValueError, "pad: padding 0.5 must be a whole number"),
    ("dilate by 1.5: deep in NumPy", lambda: ops.dilate(T((2, 3)), (0,), 1.5),
     ValueError, "dilation 1.5 must be a whole number >= 0"),
    ("conv stride 1.5: deep in NumPy",
     lambda: ops.conv(T((1, 4, 4, 3)), T((3, 3, 3, 2)), stride=1.5),
     ValueError, "conv: stride 1.5 must be a whole number >= 1"),
    ("sum(axes=1.0): 'float' object is not iterable", lambda: T((2, 3)).sum(axes=1.0),
     TypeError, "sum: axis must be an int, got 1.0"),
    # ---- init
    ("rand(-1): NumPy's negative dimensions", lambda: init.rand(-1),
     ValueError, "rand: size -1 must be a whole number >= 0"),
    ("rand(2.5): NumPy's float not an integer", lambda: init.rand(2.5),
     ValueError, "rand: size 2.5 must be a whole number >= 0"),
    ("zeros((2, 3)): NumPy's tuple not an integer", lambda: init.zeros((2, 3)),
     TypeError, "takes sizes as separate arguments: constant(2, 3)"),
    ("ones(True): NumPy's an integer is required", lambda: init.ones(True),
     ValueError, "constant: size True must be a whole number >= 0 (got a bool)"),
    ("rand(low=1, high=0) sampled from (0, 1]", lambda: init.rand(3, low=1, high=0),
     ValueError, "rand: low 1 must be <= high 0"),
    ("rand(low=nan) gave nan", lambda: init.rand(3, low=NAN),
     ValueError, "rand: low nan must be a finite number"),
    ("randn(std=-1) gave flipped samples", lambda: init.randn(3, std=-1),
     ValueError, "randn: std -1 must be a finite number >= 0"),
    ("randn(std=nan) gave nan", lambda: init.randn(3, std=NAN), ValueError, "randn: std nan"),
    ("constant(c='a'): NumPy's could not convert", lambda: init.constant(2, c="a"),
     TypeError, "constant: c must be a number, got str 'a'"),
    ("one_hot(2.5, ...): deep in the device", lambda: init.one_hot(2.5, I((2,))),
     ValueError, "one_hot: n 2.5 must be a whole number >= 0"),
    ("xavier gain nan gave nan weights", lambda: init.xavier_uniform(3, 3, gain=NAN),
     ValueError, "xavier_uniform: gain nan must be a finite number >= 0"),
    # ---- nn
    ("Linear(2.5, 3): deep in NumPy", lambda: nn.Linear(2.5, 3),
     ValueError, "Linear: in_features 2.5 must be a whole number >= 1"),
    ("Linear('3', 3): '<=' between str and int", lambda: nn.Linear("3", 3),
     ValueError, "Linear: in_features '3' must be a whole number >= 1, not a str"),
    ("Linear(3, 3, bias='no') had a bias", lambda: nn.Linear(3, 3, bias="no"),
     TypeError, "Linear: bias must be True or False, got 'no'"),
    ("Linear on a 0-d input: IndexError", lambda: nn.Linear(3, 4)(T(())),
     ValueError, "Linear(3, 4) got input of shape ()"),
    ("Flatten of a 0-d input: IndexError", lambda: nn.Flatten()(T(())),
     ValueError, "Flatten needs a batch axis first"),
    ("Sequential(ReLU(), 3): 'int' object is not callable at forward",
     lambda: nn.Sequential(nn.ReLU(), 3), TypeError, "Sequential: item 1 is int, not a Module"),
    ("Residual(3): not callable at forward", lambda: nn.Residual(3),
     TypeError, "Residual: fn is int, not a Module"),
    ("BatchNorm1d eps=-1 gave nan", lambda: nn.BatchNorm1d(3, eps=-1),
     ValueError, "BatchNorm1d: eps -1 must be a finite number >= 0"),
    ("BatchNorm1d momentum=2 diverged", lambda: nn.BatchNorm1d(3, momentum=2),
     ValueError, "BatchNorm1d: momentum 2 must be a finite number in [0, 1]"),
    ("BatchNorm2d momentum=nan", lambda: nn.BatchNorm2d(3, momentum=NAN),
     ValueError, "BatchNorm2d: momentum nan"),
    ("BatchNorm1d(0) accepted", lambda: nn.BatchNorm1d(0),
     ValueError, "BatchNorm1d: dim 0 must be a whole number >= 1"),
    ("LayerNorm1d eps=nan gave nan", lambda: nn.LayerNorm1d(3, eps=NAN),
     ValueError, "LayerNorm1d: eps nan must be a finite number >= 0"),
    ("Dropout('0.5'): '<=' between float and str", lambda: nn.Dropout("0.5"),
     ValueError, "Dropout p must lie in [0, 1), got '0.5'"),
    ("Embedding(3, -4): NumPy's negative dimensions", lambda: nn.Embedding(3, -4),
     ValueError, "Embedding: embedding_dim -4 must be a whole number >= 1"),
    ("Embedding(0, 4) accepted", lambda: nn.Embedding(0, 4),
     ValueError, "Embedding: num_embeddings 0 must be a whole number >= 1"),
    ("Conv kernel -3: NumPy's negative dimensions", lambda: nn.Conv(3, 4, -3),
     ValueError, "Conv: kernel_size -3 must be a whole number >= 1"),
    ("Conv stride 0 accepted until the forward", lambda: nn.Conv(3, 4, 3, stride=0),
     ValueError, "Conv: stride 0 must be a whole number >= 1"),
    ("Conv stride (2, 1) ran as 2", lambda: nn.Conv(3, 4, 3, stride=(2, 1)),
     ValueError, "Conv supports equal strides only, got (2, 1)"),
    ("RNN(num_layers=0) accepted", lambda: nn.RNN(3, 4, num_layers=0),
     ValueError, "RNN: num_layers 0 must be a whole number >= 1"),
    ("RNN over no time steps: 'stack needs at least one array'",
     lambda: nn.RNN(3, 4)(T((0, 2, 3))), ValueError, "RNN got an input of no time steps"),
    ("RNN h0 for 3 sequences with 2: a broadcast error",
     lambda: nn.RNN(3, 4)(T((5, 2, 3)), T((1, 3, 4))), ValueError,
     "RNN: h0 must have shape (num_layers, bs, hidden) = (1, 2, 4), got (1, 3, 4)"),
    ("RNN of 2 layers given h0 of 1 layer ran only the first layer (zip)",
     lambda: nn.RNN(3, 4, num_layers=2)(T((5, 2, 3)), T((1, 2, 4))), ValueError,
     "RNN: h0 must have shape (num_layers, bs, hidden) = (2, 2, 4), got (1, 2, 4)"),
    ("LSTM h a Tensor, not a pair: IndexError", lambda: nn.LSTM(3, 4)(T((5, 2, 3)), T((1, 2, 4))),
     TypeError, "LSTM: h must be a pair (h0, c0), got Tensor"),
    ("LSTM c0 of the wrong width: a matmul error",
     lambda: nn.LSTM(3, 4)(T((5, 2, 3)), (T((1, 2, 4)), T((1, 2, 5)))), ValueError,
     "LSTM: c0 must have shape (num_layers, bs, hidden) = (1, 2, 4), got (1, 2, 5)"),
    # ---- optim
    ("SGD(one Tensor) iterated its rows: new tensors, never the parameter",
     lambda: optim.SGD(nn.Parameter(T((2,)))), TypeError,
     "SGD: params must be an iterable of Tensors, got one Tensor"),
    ("a state key 'x': int()'s invalid literal",
     lambda: optim.Adam([nn.Parameter(T((2,)))]).load_state_dict(
         {"hyper": {}, "state": {"x": {}}}), ValueError,
     "optimizer state key (a parameter index) 'x' must be a whole number >= 0"),
    # ---- data
    ("DataLoader(None): len() of NoneType", lambda: data.DataLoader(None, 2),
     TypeError, "DataLoader: dataset must have a length and items (a Dataset), got NoneType"),
    ("DataLoader(shuffle='no') shuffled",
     lambda: data.DataLoader(data.NDArrayDataset(np.ones((3, 2))), 2, shuffle="no"),
     TypeError, "DataLoader: shuffle must be True or False, got 'no'"),
    ("SequentialSampler(None): len() of NoneType", lambda: data.SequentialSampler(None),
     TypeError, "SequentialSampler: dataset must have a length, got NoneType"),
    ("RandomCrop of a 2-D image: deep in NumPy", lambda: data.RandomCrop(2)(np.ones((4, 4))),
     ValueError, "RandomCrop takes one H x W x C image, got (4, 4)"),
    ("RandomFlipHorizontal of a 1-D array: IndexError",
     lambda: data.RandomFlipHorizontal(1.0)(np.ones(4)), ValueError,
     "RandomFlipHorizontal takes one H x W x C image, got (4,)"),
    ("spirals(-5): NumPy's number of samples", lambda: data.spirals(-5),
     ValueError, "spirals: n_per_class -5 must be a whole number >= 1"),
    ("blobs(nan): deep in NumPy", lambda: data.blobs(NAN),
     ValueError, "blobs: n nan must be a whole number >= 1"),
    # ---- checkpoints
    ("a dict that holds itself: RecursionError",
     lambda: (lambda d: (d.__setitem__("d", d), ndl.save(d, "/nonexistent/x.ndl")))({}),
     ValueError, "ndl.save: obj['d'] contains itself"),
    ("ndl.load(device='gpu') blamed the file ('not a valid needle checkpoint')",
     lambda: ndl.load("/nonexistent.ndl", device="gpu"), TypeError,
     "ndl.load: device must be a needle BackendDevice (ndl.cpu(), ndl.cuda()), got str 'gpu'"),
    # ---- the probe's second round: parallel, amp, memory, profiler, schedules, samplers
    # (10**6 started threads until the OS refused, the process unusable after; 1025 is the
    # first size refused, and cheap to run should the bound be lost)
    ("virtual.run(1025): one thread per rank, without a bound",
     lambda: virtual.run(1025, lambda c: 0), ValueError,
     "virtual cluster world_size 1025 must be a whole number in [1, 1024]"),
    ("virtual.run(2.5): range() in the scheduler", lambda: virtual.run(2.5, lambda c: 0),
     ValueError, "world_size 2.5 must be a whole number"),
    ("virtual.run(2, 3): every rank failed calling an int", lambda: virtual.run(2, 3),
     TypeError, "virtual.run: fn must be callable, got int"),
    ("LoRALinear alpha nan scaled every update to nan",
     lambda: nn.LoRALinear(nn.Linear(4, 4), r=2, alpha=NAN), ValueError,
     "LoRALinear: alpha nan must be a finite number"),
    ("GradScaler(init_scale=nan) skipped every step", lambda: amp.GradScaler(init_scale=NAN),
     ValueError, "GradScaler: init_scale nan must be a finite number > 0"),
    ("GradScaler(growth_interval=2.5) accepted", lambda: amp.GradScaler(growth_interval=2.5),
     ValueError, "GradScaler: growth_interval 2.5 must be a whole number >= 1"),
    ("MemoryTracker('gpu'): AttributeError 'enabled'", lambda: memory.MemoryTracker("gpu"),
     TypeError, "MemoryTracker: device must be a needle BackendDevice, got str 'gpu'"),
    ("profile(max_events=0) dropped every event", lambda: profiler.profile(max_events=0),
     ValueError, "profile: max_events 0 must be a whole number >= 1"),
    ("DistributedSampler(shuffle='no') shuffled",
     lambda: data.DistributedSampler(data.NDArrayDataset(np.ones((4, 2))), 2, 0, shuffle="no"),
     TypeError, "DistributedSampler: shuffle must be True or False, got 'no'"),
    ("set_epoch(1.5) ran as epoch 1",
     lambda: data.DistributedSampler(data.NDArrayDataset(np.ones((4, 2))), 2, 0).set_epoch(1.5),
     ValueError, "DistributedSampler.set_epoch: epoch 1.5 must be a whole number >= 0"),
    ("DataLoader(seed=-1): deep in NumPy's SeedSequence",
     lambda: data.DataLoader(data.NDArrayDataset(np.ones((3, 2))), 2, shuffle=True, seed=-1),
     ValueError, "DataLoader: seed -1 must be a whole number >= 0"),
    ("StepLR(3, 2): AttributeError 'lr'", lambda: optim.StepLR(3, 2),
     TypeError, "StepLR schedules an optimizer's lr, got int"),
    ("load_digits(test_fraction=nan): scikit-learn imported and loaded first",
     lambda: data.load_digits(test_fraction=NAN), ValueError,
     "test_fraction must lie in (0, 1), got nan"),
    # ---- the third round: parallel strategies, quantization, metrics, DLPack
    ("ParameterServer(timeout=inf): a worker waited for ever on a dead server",
     lambda: virtual.run(2, lambda c: ParameterServer(c, nn.Linear(2, 2), optim.SGD,
                                                      timeout=float("inf"))),
     RankFailedError, "timeout must be a finite number > 0, got inf"),
    ("PipelineParallel(num_microbatches=nan): range() of a float",
     lambda: virtual.run(2, lambda c: PipelineParallel(nn.Linear(2, 2), c, NAN)),
     RankFailedError, "PipelineParallel: num_microbatches nan must be a whole number >= 1"),
    ("FullyShardedDataParallel(3): AttributeError 'named_parameters'",
     lambda: virtual.run(2, lambda c: FullyShardedDataParallel(3, c)), RankFailedError,
     "FullyShardedDataParallel wraps an nn.Module, got int"),
    ("quantize_nf4(block_size=0): ZeroDivisionError", lambda: quant.quantize_nf4(
        T((4, 64)), block_size=0), ValueError, "NF4: block_size 0 must be a whole number >= 1"),
    ("quantize_nf4 of nan weights: arbitrary codes, a cast warning only",
     lambda: quant.quantize_nf4(T((4, 64)) * NAN), ValueError,
     "cannot quantize a weight holding nan or inf"),
    ("perplexity(-1.0) = 0.37, an impossible loss", lambda: metrics.perplexity(-1.0),
     ValueError, "perplexity: loss_nats must be a cross-entropy >= 0, got -1.0"),
    ("from_dlpack(3): AttributeError '__dlpack_device__'", lambda: ndl.from_dlpack(3),
     TypeError, "from_dlpack: int is not a DLPack producer"),
]


@pytest.mark.parametrize("why, call, exc, words", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_refused_at_the_door(why: str, call: Callable[[], Any], exc: type,
                                          words: str) -> None:
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), f"{why}: {info.value!r}"


def test_what_the_doors_still_accept(tmp_path: Any) -> None:
    """The checks refuse only what was wrong: whole floats and NumPy ints as sizes, in-range
    casts, a shared (not cyclic) object saved twice, sizes of 0, a lambda in Sequential."""
    assert T((2, 3)).reshape((3.0, np.int64(2))).shape == (3, 2)
    assert T((1, 3)).broadcast_to((np.int64(2), 3)).shape == (2, 3)
    assert ndl.Tensor(np.array([255], np.int64), dtype="uint8").numpy().tolist() == [255]
    assert ndl.Tensor(np.array([1.7, -2.2]), dtype="int32").numpy().tolist() == [1, -2]
    assert init.zeros(0, 3).shape == (0, 3) and init.rand(2, low=1, high=1).numpy().tolist() \
        == [1.0, 1.0]
    assert nn.Linear(np.int64(3), 4.0).weight.shape == (3, 4)
    assert nn.Sequential(lambda x: x * 2)(T((2,))).numpy().tolist() == [2.0, 2.0]
    assert nn.RNN(3, 4, num_layers=2)(T((5, 2, 3)), T((2, 2, 4)))[1].shape == (2, 2, 4)
    assert metrics.perplexity(0.0) == 1.0 and metrics.perplexity(1e6) == float("inf")
    shared = np.ones(2)
    ndl.save({"a": shared, "b": [shared, shared]}, str(tmp_path / "shared.ndl"))
    assert sorted(ndl.load(str(tmp_path / "shared.ndl"))) == ["a", "b"]
