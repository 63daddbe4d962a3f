"""The course's public API as its homework documents it (hw0-hw4): names, parameter names and
defaults, in order. needle may add parameters after the course's ones, never rename or reorder
them. The table is written from the homework handouts, not read from needle's code.
"""
import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import needle as ndl
from apps import mlp_resnet, models, simple_ml
from needle import backend_ndarray as nd
from needle import data, init, nn, optim

_ = inspect.Parameter.empty  # a required parameter

COURSE_API = {
    # hw1: ops (lowercase wrappers) and autograd
    "ops.add": [("a", _), ("b", _)],
    "ops.add_scalar": [("a", _), ("scalar", _)],
    "ops.multiply": [("a", _), ("b", _)],
    "ops.mul_scalar": [("a", _), ("scalar", _)],
    "ops.power_scalar": [("a", _), ("scalar", _)],
    "ops.power": [("a", _), ("b", _)],
    "ops.divide": [("a", _), ("b", _)],
    "ops.divide_scalar": [("a", _), ("scalar", _)],
    "ops.transpose": [("a", _), ("axes", None)],
    "ops.reshape": [("a", _), ("shape", _)],
    "ops.broadcast_to": [("a", _), ("shape", _)],
    "ops.summation": [("a", _), ("axes", None)],
    "ops.matmul": [("a", _), ("b", _)],
    "ops.negate": [("a", _)],
    "ops.log": [("a", _)],
    "ops.exp": [("a", _)],
    "ops.relu": [("a", _)],
    "ops.tanh": [("a", _)],
    "ops.logsoftmax": [("a", _)],
    "ops.logsumexp": [("a", _), ("axes", None)],
    "ops.stack": [("args", _), ("axis", _)],
    "ops.split": [("a", _), ("axis", _)],
    "ops.flip": [("a", _), ("axes", _)],
    "ops.dilate": [("a", _), ("axes", _), ("dilation", _)],
    "ops.undilate": [("a", _), ("axes", _), ("dilation", _)],
    "ops.conv": [("a", _), ("b", _), ("stride", 1), ("padding", 1)],
    "ops.Conv": [("stride", 1), ("padding", 0)],
    "ops.Summation": [("axes", None)],
    "ops.Transpose": [("axes", None)],
    "ops.LogSumExp": [("axes", None)],
    "ops.tuple_get_item": [("value", _), ("index", _)],
    "ops.fused_add_scalars": [("x", _), ("c0", _), ("c1", _)],
    "autograd.find_topo_sort": [("node_list", _)],
    "autograd.compute_gradient_of_variables": [("output_tensor", _), ("out_grad", _)],
    "autograd.sum_node_list": [("node_list", _)],
    "autograd.Tensor.backward": [("self", _), ("out_grad", None)],
    "autograd.Tensor.make_const": [("data", _), ("requires_grad", False)],
    "autograd.Tensor.make_from_op": [("op", _), ("inputs", _)],
    "autograd.Tensor.sum": [("self", _), ("axes", None)],
    "autograd.Tensor.transpose": [("self", _), ("axes", None)],
    "autograd.Tensor.broadcast_to": [("self", _), ("shape", _)],
    "autograd.Op.gradient_as_tuple": [("self", _), ("out_grad", _), ("node", _)],
    # hw2: init, nn, optim, data
    "init.rand": [("shape", _), ("low", 0.0), ("high", 1.0), ("device", None),
                  ("dtype", "float32"), ("requires_grad", False)],
    "init.randn": [("shape", _), ("mean", 0.0), ("std", 1.0), ("device", None),
                   ("dtype", "float32"), ("requires_grad", False)],
    "init.constant": [("shape", _), ("c", 1.0), ("device", None), ("dtype", "float32"),
                      ("requires_grad", False)],
    "init.ones": [("shape", _), ("device", None), ("dtype", "float32"), ("requires_grad", False)],
    "init.zeros": [("shape", _), ("device", None), ("dtype", "float32"),
                   ("requires_grad", False)],
    "init.randb": [("shape", _), ("p", 0.5), ("device", None), ("dtype", "bool"),
                   ("requires_grad", False)],
    "init.one_hot": [("n", _), ("i", _), ("device", None), ("dtype", "float32"),
                     ("requires_grad", False)],
    "init.zeros_like": [("array", _), ("device", None), ("requires_grad", False)],
    "init.ones_like": [("array", _), ("device", None), ("requires_grad", False)],
    "init.xavier_uniform": [("fan_in", _), ("fan_out", _), ("gain", 1.0)],
    "init.xavier_normal": [("fan_in", _), ("fan_out", _), ("gain", 1.0)],
    "init.kaiming_uniform": [("fan_in", _), ("fan_out", _), ("nonlinearity", "relu")],
    "init.kaiming_normal": [("fan_in", _), ("fan_out", _), ("nonlinearity", "relu")],
    "nn.Linear": [("in_features", _), ("out_features", _), ("bias", True), ("device", None),
                  ("dtype", "float32")],
    "nn.Sequential": [("modules", _)],
    "nn.BatchNorm1d": [("dim", _), ("eps", 1e-5), ("momentum", 0.1), ("device", None),
                       ("dtype", "float32")],
    "nn.BatchNorm2d": [("dim", _), ("eps", 1e-5), ("momentum", 0.1), ("device", None),
                       ("dtype", "float32")],
    "nn.LayerNorm1d": [("dim", _), ("eps", 1e-5), ("device", None), ("dtype", "float32")],
    "nn.Dropout": [("p", 0.5)],
    "nn.Residual": [("fn", _)],
    "optim.SGD": [("params", _), ("lr", 0.01), ("momentum", 0.0), ("weight_decay", 0.0)],
    "optim.Adam": [("params", _), ("lr", 0.01), ("beta1", 0.9), ("beta2", 0.999),
                   ("eps", 1e-8), ("weight_decay", 0.0)],
    "data.Dataset": [("transforms", None)],
    "data.DataLoader": [("dataset", _), ("batch_size", 1), ("shuffle", False)],
    "data.MNISTDataset": [("image_filename", _), ("label_filename", _), ("transforms", None)],
    "data.NDArrayDataset": [("arrays", _)],
    "data.RandomFlipHorizontal": [("p", 0.5)],
    "data.RandomCrop": [("padding", 3)],
    # hw3: NDArray
    "nd.NDArray.make": [("shape", _), ("strides", None), ("device", None), ("handle", None),
                        ("offset", 0)],
    "nd.NDArray.compact_strides": [("shape", _)],
    "nd.NDArray.as_strided": [("self", _), ("shape", _), ("strides", _)],
    "nd.NDArray.reshape": [("self", _), ("new_shape", _)],
    "nd.NDArray.permute": [("self", _), ("new_axes", _)],
    "nd.NDArray.broadcast_to": [("self", _), ("new_shape", _)],
    "nd.NDArray.process_slice": [("self", _), ("sl", _), ("dim", _)],
    "nd.NDArray.sum": [("self", _), ("axis", None), ("keepdims", False)],
    "nd.NDArray.max": [("self", _), ("axis", None), ("keepdims", False)],
    "nd.NDArray.flip": [("self", _), ("axes", _)],
    "nd.NDArray.pad": [("self", _), ("axes", _)],
    "nd.empty": [("shape", _), ("dtype", "float32"), ("device", None)],
    "nd.full": [("shape", _), ("fill_value", _), ("dtype", "float32"), ("device", None)],
    "nd.broadcast_to": [("a", _), ("shape", _)],
    "nd.sum": [("a", _), ("axis", None), ("keepdims", False)],
    "nd.flip": [("a", _), ("axes", _)],
    # hw4: conv, sequence models, transformer, CIFAR/PTB data
    "nn.Conv": [("in_channels", _), ("out_channels", _), ("kernel_size", _), ("stride", 1),
                ("bias", True), ("device", None), ("dtype", "float32")],
    "nn.RNNCell": [("input_size", _), ("hidden_size", _), ("bias", True),
                   ("nonlinearity", "tanh"), ("device", None), ("dtype", "float32")],
    "nn.RNN": [("input_size", _), ("hidden_size", _), ("num_layers", 1), ("bias", True),
               ("nonlinearity", "tanh"), ("device", None), ("dtype", "float32")],
    "nn.LSTMCell": [("input_size", _), ("hidden_size", _), ("bias", True), ("device", None),
                    ("dtype", "float32")],
    "nn.LSTM": [("input_size", _), ("hidden_size", _), ("num_layers", 1), ("bias", True),
                ("device", None), ("dtype", "float32")],
    "nn.Embedding": [("num_embeddings", _), ("embedding_dim", _), ("device", None),
                     ("dtype", "float32")],
    "nn.MultiHeadAttention": [("dropout", 0.0), ("causal", False), ("device", None),
                              ("dtype", "float32")],
    "nn.AttentionLayer": [("q_features", _), ("num_head", _), ("dim_head", _),
                          ("k_features", None), ("v_features", None), ("out_features", None),
                          ("dropout", 0.0), ("causal", True), ("device", None),
                          ("dtype", "float32")],
    "nn.TransformerLayer": [("q_features", _), ("num_head", _), ("dim_head", _),
                            ("hidden_size", _), ("dropout", 0.0), ("causal", True),
                            ("device", None), ("dtype", "float32")],
    "nn.Transformer": [("embedding_size", _), ("hidden_size", _), ("num_layers", _),
                       ("num_head", 8), ("dim_head", 32), ("dropout", 0.0), ("causal", True),
                       ("device", None), ("dtype", "float32"), ("batch_first", False),
                       ("sequence_len", 2048)],
    "data.CIFAR10Dataset": [("base_folder", _), ("train", _), ("p", 0.5), ("transforms", None)],
    "data.Corpus": [("base_dir", _), ("max_lines", None)],
    "data.Corpus.tokenize": [("self", _), ("path", _), ("max_lines", None)],
    "data.Dictionary.add_word": [("self", _), ("word", _)],
    "data.batchify": [("data", _), ("batch_size", _), ("device", _), ("dtype", _)],
    "data.get_batch": [("batches", _), ("i", _), ("bptt", _), ("device", None), ("dtype", None)],
    # apps (hw0, hw1, hw2, hw4)
    "simple_ml.add": [("x", _), ("y", _)],
    "simple_ml.parse_mnist": [("image_filename", _), ("label_filename", _)],
    "simple_ml.softmax_regression_epoch": [("X", _), ("y", _), ("theta", _), ("lr", 0.1),
                                           ("batch", 100)],
    "simple_ml.softmax_loss": [("Z", _), ("y_one_hot", _)],
    "simple_ml.nn_epoch": [("X", _), ("y", _), ("W1", _), ("W2", _), ("lr", 0.1),
                           ("batch", 100)],
    "simple_ml.train_cifar10": [("model", _), ("dataloader", _), ("n_epochs", 1),
                                ("optimizer", optim.Adam), ("lr", 0.001),
                                ("weight_decay", 0.001), ("loss_fn", nn.SoftmaxLoss)],
    "simple_ml.evaluate_cifar10": [("model", _), ("dataloader", _),
                                   ("loss_fn", nn.SoftmaxLoss)],
    "simple_ml.train_ptb": [("model", _), ("data", _), ("seq_len", 40), ("n_epochs", 1),
                            ("optimizer", optim.SGD), ("lr", 4.0), ("weight_decay", 0.0),
                            ("loss_fn", nn.SoftmaxLoss), ("clip", None), ("device", None),
                            ("dtype", "float32")],
    "simple_ml.evaluate_ptb": [("model", _), ("data", _), ("seq_len", 40),
                               ("loss_fn", nn.SoftmaxLoss), ("device", None),
                               ("dtype", "float32")],
    "mlp_resnet.ResidualBlock": [("dim", _), ("hidden_dim", _), ("norm", nn.BatchNorm1d),
                                 ("drop_prob", 0.1)],
    "mlp_resnet.MLPResNet": [("dim", _), ("hidden_dim", 100), ("num_blocks", 3),
                             ("num_classes", 10), ("norm", nn.BatchNorm1d), ("drop_prob", 0.1)],
    "mlp_resnet.epoch": [("dataloader", _), ("model", _), ("opt", None)],
    "mlp_resnet.train_mnist": [("batch_size", 100), ("epochs", 10), ("optimizer", optim.Adam),
                               ("lr", 0.001), ("weight_decay", 0.001), ("hidden_dim", 100),
                               ("data_dir", "data")],
    "models.ResNet9": [("device", None), ("dtype", "float32")],
    "models.LanguageModel": [("embedding_size", _), ("output_size", _), ("hidden_size", _),
                             ("num_layers", 1), ("seq_model", "rnn"), ("seq_len", 40),
                             ("device", None), ("dtype", "float32")],
}

ROOTS = {"ops": ndl.ops, "autograd": ndl.autograd, "init": init, "nn": nn, "optim": optim,
         "data": data, "nd": nd, "simple_ml": simple_ml, "mlp_resnet": mlp_resnet,
         "models": models}


def _resolve(name: str):
    root, *rest = name.split(".")
    obj = ROOTS[root]
    for part in rest:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(COURSE_API))
def test_course_signature(name):
    params = list(inspect.signature(_resolve(name)).parameters.values())
    want = COURSE_API[name]
    # a default where the course has none is compatible (course code always passes it)
    got = [(p.name, _ if d is _ else p.default) for p, (_n, d) in zip(params, want)]
    assert got == want


COURSE_NAMES = [
    # classes and functions the handouts name without pinning a signature
    "ops.EWiseAdd", "ops.AddScalar", "ops.EWiseMul", "ops.MulScalar", "ops.PowerScalar",
    "ops.EWisePow", "ops.EWiseDiv", "ops.DivScalar", "ops.Reshape", "ops.BroadcastTo",
    "ops.MatMul", "ops.Negate", "ops.Log", "ops.Exp", "ops.ReLU", "ops.Tanh", "ops.Stack",
    "ops.Split", "ops.Flip", "ops.Dilate", "ops.UnDilate", "ops.LogSoftmax",
    "ops.MakeTensorTuple", "ops.TupleGetItem", "ops.make_tuple",
    "autograd.Value", "autograd.Op", "autograd.TensorOp", "autograd.TensorTupleOp",
    "autograd.TensorTuple", "autograd.LAZY_MODE", "autograd.TENSOR_COUNTER",
    "autograd.Value.realize_cached_data", "autograd.Value.is_leaf", "autograd.Tensor.detach",
    "autograd.Tensor.numpy", "autograd.Tensor.reshape", "autograd.Tensor.matmul",
    "nn.Module", "nn.Parameter", "nn.Identity", "nn.Flatten", "nn.ReLU", "nn.Tanh",
    "nn.Sigmoid", "nn.SoftmaxLoss", "nn.Module.parameters", "nn.Module._children",
    "nn.Module.eval", "nn.Module.train", "optim.Optimizer", "optim.Optimizer.step",
    "optim.Optimizer.reset_grad", "data.Transform", "data.Dictionary",
    "data.Dataset.apply_transforms", "nd.NDArray", "nd.NDArray.flat", "nd.NDArray.fill",
    "nd.NDArray.to", "nd.NDArray.numpy", "nd.NDArray.is_compact", "nd.NDArray.compact",
    "nd.NDArray.maximum", "nd.NDArray.log", "nd.NDArray.exp", "nd.NDArray.tanh", "nd.array",
    "nd.reshape", "nd.maximum", "nd.log", "nd.exp", "nd.tanh", "nd.cpu", "nd.cuda",
    "nd.cpu_numpy", "nd.all_devices", "nd.default_device", "nd.BackendDevice",
    "simple_ml.epoch_general_cifar10", "simple_ml.epoch_general_ptb",
]


@pytest.mark.parametrize("name", COURSE_NAMES)
def test_course_name_exists(name):
    _resolve(name)


def test_module_children_are_every_descendant():
    inner = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model = nn.Sequential(inner, nn.Dropout(0.1))
    kids = model._children()
    assert model not in kids
    # as in the course, Sequential keeps its list in .modules
    assert {id(m) for m in kids} == {id(inner), id(inner.modules[0]), id(inner.modules[1]),
                                     id(model.modules[1])}
    model.eval()
    assert not any(m.training for m in kids)


def test_add_is_hw0s_first_exercise():
    assert simple_ml.add(5, 6) == 11
    np.testing.assert_array_equal(simple_ml.add(np.eye(2), np.ones((2, 2))), np.eye(2) + 1)


@pytest.mark.parametrize("emulator", ["0", "1"])
def test_cuda_device_is_listed_and_skippable_on_a_cpu_only_machine(emulator):
    """The course's test header: ``pytest.param(ndl.cuda(), marks=skipif(not enabled))``;
    with NEEDLE_CUDA_EMULATOR=1 and no GPU the device is enabled and says it is emulated."""
    code = ("import needle as ndl\n"
            "d = ndl.cuda()\n"
            "print(d.enabled(), repr(d).replace(' ', ''),\n"
            "      hasattr(d, 'ewise_add') == d.enabled())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120,
                         env={**os.environ, "NEEDLE_CUDA_EMULATOR": emulator})
    assert res.returncode == 0, res.stderr
    from needle.backend_cuda.emulator import real_gpu_count
    if real_gpu_count():
        assert res.stdout.split() == ["True", "cuda(0)", "True"]
    elif emulator == "1":
        assert res.stdout.split() == ["True", "cuda(0,emulated)", "True"]
    else:
        assert res.stdout.split()[1:] == ["cuda(0)", "True"]
