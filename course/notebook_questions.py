"""Writes the question cells of the homework notebooks (hw1-hw4, CUDA, collectives).

    python -m course.notebook_questions   # rewrites the notebooks' question part

Each question: what to implement (file, function, exercise id), the spec, a cell grading it
(``grade("<exercise>")``, course/notebook.py) and a short demonstration. The notebooks' own
cells after the questions (the walkthrough) are kept.
"""
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .exercises import requirements

ROOT = Path(__file__).resolve().parents[1]
MARK = "course.notebook_questions"  # metadata tag of the generated cells
Q = Tuple[str, str, str, str, str]  # exercise, where, function, spec, demonstration

PATH = """import os
import sys

sys.path.insert(0, os.path.abspath('..'))   # the repository root: needle, apps, course
"""

# the CUDA notebook: no GPU here? emulate one (set before needle is imported)
CUDA_PATH = PATH + """os.environ.setdefault("NEEDLE_CUDA_EMULATOR", "1")
"""

# hw1 and hw2: NumPy arrays, as in the course before hw3's NDArray (README, "Dtypes")
NP_PATH = PATH + """os.environ.setdefault("NEEDLE_BACKEND", "np")
"""

SETUP = """import numpy as np

import needle as ndl
from course.notebook import grade  # grade('hw1.ops.multiply'): that exercise's graded tests
from needle import nn, ops  # noqa: F401


def gradcheck(f, *shapes, low=0.5, high=1.5, eps=1e-6, seed=0):
    \"\"\"max |op gradient - central differences| of y = f(*inputs), one op on the inputs.

    Calls y's op's gradient directly (upstream gradient all ones, float64), not backward():
    a question's check needs only that op, not the autograd questions further on.
    \"\"\"
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(low, high, s) for s in shapes]
    ts = [ndl.Tensor(a, dtype='float64') for a in arrays]
    y = f(*ts)
    assert all(i is t for i, t in zip(y.inputs, ts)), "f must be one op on its inputs"
    grads = y.op.gradient_as_tuple(ndl.Tensor(np.ones(y.shape)), y)
    err = 0.0
    for a, g in zip(arrays, grads):
        for j in range(a.size):
            ap, am = a.copy(), a.copy()
            ap.flat[j] += eps
            am.flat[j] -= eps
            def val(arr):
                xs = [ndl.Tensor(arr if x is a else x, dtype='float64') for x in arrays]
                return float(f(*xs).numpy().sum())
            num = (val(ap) - val(am)) / (2 * eps)
            err = max(err, abs(num - g.numpy().flat[j]))
    return err
"""

OPS = "needle/ops/ops_mathematic.py"
HW1: List[Q] = [
    ("hw1.ops.multiply", OPS, "EWiseMul.gradient",
     "d(a*b) is (out_grad * b, out_grad * a); each summed back to its input's shape with "
     "`unbroadcast` (inputs may broadcast).",
     "print(gradcheck(lambda a, b: a * b, (3, 4), (3, 4)))"),
    ("hw1.ops.power", OPS, "EWisePow.gradient",
     "a ** b for tensors: (b * a ** (b - 1) * out_grad, a ** b * log(a) * out_grad), each "
     "unbroadcast to its input's shape.", "print(gradcheck(lambda a, b: a ** b, (3,), (3,)))"),
    ("hw1.ops.power_scalar", OPS, "PowerScalar.compute, PowerScalar.gradient",
     "compute: `a ** self.scalar` on the NDArray; gradient: scalar * a ** (scalar - 1) * "
     "out_grad.", "print(gradcheck(lambda a: a ** 3, (2, 3)))"),
    ("hw1.ops.divide", OPS, "EWiseDiv.compute, EWiseDiv.gradient",
     "a / b elementwise; gradient (out_grad / b, -out_grad * a / b ** 2), unbroadcast.",
     "print(gradcheck(lambda a, b: a / b, (2, 3), (2, 3)))"),
    ("hw1.ops.divide_scalar", OPS, "DivScalar.compute, DivScalar.gradient",
     "a / scalar; gradient out_grad / scalar. The result keeps a's dtype.",
     "print(gradcheck(lambda a: a / 4.0, (2, 3)))"),
    ("hw1.ops.log", OPS, "Log.gradient", "out_grad / a.", "print(gradcheck(ops.log, (4,)))"),
    ("hw1.ops.exp", OPS, "Exp.gradient", "out_grad * exp(a) (the node itself is exp(a)).",
     "print(gradcheck(ops.exp, (4,)))"),
    ("hw1.ops.relu", OPS, "ReLU.gradient",
     "out_grad where a > 0, else 0 (the mask is a constant: relu is not differentiable twice).",
     "print(gradcheck(ops.relu, (5,), low=-1.0))"),
    ("hw1.ops.tanh", OPS, "Tanh.gradient", "out_grad * (1 - tanh(a) ** 2).",
     "print(gradcheck(ops.tanh, (4,)))"),
    ("hw1.ops.transpose", OPS, "Transpose.compute, Transpose.gradient",
     "axes=None swaps the last two axes; axes=(i, j) swaps axes i and j (NDArray.permute). "
     "The gradient transposes out_grad back.",
     "print(ops.transpose(ndl.Tensor(np.zeros((2, 3, 4))), (0, 2)).shape)  # (4, 3, 2)"),
    ("hw1.ops.reshape", OPS, "Reshape.compute, Reshape.gradient",
     "compute: `a.compact().reshape(shape)` (one -1 allowed); gradient: out_grad reshaped to "
     "the input's shape.", "print(ops.reshape(ndl.Tensor(np.arange(6.0)), (2, -1)))"),
    ("hw1.ops.broadcast_to", OPS, "unbroadcast (BroadcastTo.gradient calls it)",
     "sum grad over the axes an input of `shape` was broadcast along (the leading axes added, "
     "and each axis of size 1 stretched), then reshape to exactly `shape`.",
     "print(gradcheck(lambda a: ops.broadcast_to(a, (3, 2, 4)), (2, 1)))"),
    ("hw1.ops.summation", "needle/ops/ops_reduce.py", "Summation.gradient",
     "out_grad reshaped to the input's rank (1 on the summed axes, unless keepdims) and "
     "broadcast back to the input's shape.",
     "print(gradcheck(lambda a: ops.summation(a, (1,)), (3, 4)))"),
    ("hw1.ops.matmul", OPS, "MatMul.gradient",
     "(out_grad @ b^T, a^T @ out_grad), each unbroadcast to its input's shape (batched "
     "matmul broadcasts the batch axes); an input that does not require grad gets None.",
     "print(gradcheck(lambda a, b: a @ b, (2, 3, 4), (4, 5)))"),
    ("hw1.autograd.make_from_op", "needle/autograd.py", "Value.make_from_op",
     "See its docstring: record the graph only when some input requires grad (and grad mode "
     "is on); compute now unless LAZY_MODE.",
     "x = ndl.Tensor([1.0, 2.0]); y = x * x\nprint(type(y.op).__name__, y.requires_grad)"),
    ("hw1.autograd.topo_sort", "needle/autograd.py", "find_topo_sort",
     "Every node reachable from node_list, each after all of its inputs (a post-order "
     "depth-first walk; iterative, so long chains need no recursion).",
     "x = ndl.Tensor([1.0]); y = ops.exp(x) + x\n"
     "print([type(n.op).__name__ if n.op else 'leaf' for n in ndl.autograd.find_topo_sort([y])])"),
    ("hw1.autograd.compute_gradient", "needle/autograd.py", "compute_gradient_of_variables",
     "See its docstring: adjoints summed in reverse topological order; .grad overwritten on "
     "leaves and retain_grad tensors; gradient hooks run (DDP, ZeRO and FSDP rely on them).",
     "x = ndl.Tensor([3.0]); y = x * x + x\ny.backward()\nprint(x.grad)  # 2x + 1 = 7"),
    ("hw1.simple_ml.softmax_loss", "apps/simple_ml.py", "softmax_loss",
     "Mean cross-entropy of logits Z (B, k) against one-hot labels, in needle ops: "
     "(log(exp(Z).sum(1)).sum() - (y_one_hot * Z).sum()) / B, a scalar Tensor.",
     "from apps import simple_ml\nZ = ndl.Tensor(np.array([[2.0, 0.0], [0.0, 2.0]]))\n"
     "print(simple_ml.softmax_loss(Z, ndl.Tensor(np.eye(2))))"),
    ("hw1.simple_ml.nn_epoch", "apps/simple_ml.py", "nn_epoch",
     "One epoch of SGD on a two-layer ReLU network with needle Tensors, minibatches in order; "
     "see its docstring for the shapes and the returned (W1, W2).",
     "import apps.simple_ml as sm\n\nprint(sm.nn_epoch.__doc__.splitlines()[0])"),
]

HW2: List[Q] = [
    ("hw2.ops.logsumexp", "needle/ops/ops_logarithmic.py", "LogSumExp.compute, .gradient",
     "log(sum(exp(z))) over axes, stably: max + log(sum(exp(z - max))); the gradient is "
     "out_grad * exp(z - max) / sum(exp(z - max)) broadcast back.",
     "print(ops.logsumexp(ndl.Tensor([[1e4, 1e4]]), (1,)))  # 1e4 + log 2, no overflow"),
    ("hw2.ops.logsoftmax", "needle/ops/ops_logarithmic.py", "LogSoftmax.compute, .gradient",
     "z - logsumexp(z) along the last axis; gradient out_grad - softmax(z) * sum(out_grad).",
     "print(ops.exp(ops.logsoftmax(ndl.Tensor([[1.0, 2.0, 3.0]]))).numpy().sum())  # 1"),
    ("hw2.init.rand", "needle/init/init_basic.py", "rand, randn, constant, randb, one_hot",
     "Draw from NumPy's global RNG (np.random.rand / randn) so seeded results match the "
     "course's; randb: rand <= p; one_hot(n, i): rows of the identity.",
     "np.random.seed(0); print(ndl.init.rand(2, 2))"),
    ("hw2.init.fan", "needle/init/init_initializers.py", "xavier_*, kaiming_*",
     "Glorot & Bengio and He et al.: bounds/stds from fan_in and fan_out (gain sqrt(2) for "
     "kaiming, the course's ReLU default); each draws through init.rand / init.randn.",
     "np.random.seed(0); print(ndl.init.kaiming_uniform(3, 2))"),
    ("hw2.nn.linear", "needle/nn/nn_basic.py", "Linear.__init__, Linear.forward",
     "See the docstrings: RNG draw order (weight, then bias as (out, 1) with fan_in = out) "
     "and the bias shape (1, out).",
     "np.random.seed(1); print(nn.Linear(3, 2)(ndl.Tensor(np.ones((4, 3)))).shape)"),
    ("hw2.nn.sequential", "needle/nn/nn_basic.py", "Sequential.forward",
     "Apply each module in order.",
     "print(nn.Sequential(nn.ReLU(), nn.ReLU())(ndl.Tensor([-1.0, 2.0])))"),
    ("hw2.nn.softmax_loss", "needle/nn/nn_basic.py", "SoftmaxLoss.forward",
     "Mean over the batch of logsumexp(z) - z_y (one_hot picks z_y).",
     "print(nn.SoftmaxLoss()(ndl.Tensor(np.zeros((2, 4))), ndl.Tensor([0, 3])))  # log 4"),
    ("hw2.nn.batchnorm1d", "needle/nn/nn_basic.py", "BatchNorm1d.forward",
     "Batch statistics in training (biased variance), running statistics in eval; see the "
     "docstring for the running update.",
     "bn = nn.BatchNorm1d(3); y = bn(ndl.Tensor(np.random.randn(8, 3)))\n"
     "print(y.numpy().mean(0).round(6), bn.running_mean)"),
    ("hw2.nn.layernorm1d", "needle/nn/nn_basic.py", "LayerNorm1d.forward",
     "Normalize each row over the last axis, then scale and shift (see the docstring).",
     "print(nn.LayerNorm1d(4)(ndl.Tensor(np.arange(8.0).reshape(2, 4))).numpy().round(4))"),
    ("hw2.nn.dropout", "needle/nn/nn_basic.py", "Dropout.forward",
     "Training: zero with probability p (init.randb), scale the rest by 1/(1-p); eval: "
     "identity.", "d = nn.Dropout(0.5); d.eval(); print(d(ndl.Tensor([1.0, 2.0])))"),
    ("hw2.optim.sgd", "needle/optim/optimizer.py", "SGD.step",
     "The course's momentum rule (see the class docstring): u = m u + (1 - m) g, u0 = 0.",
     "p = nn.Parameter(ndl.Tensor([1.0])); p.grad = ndl.Tensor([1.0])\n"
     "ndl.optim.SGD([p], lr=0.1).step(); print(p)  # 0.9"),
    ("hw2.optim.adam", "needle/optim/optimizer.py", "Adam.step",
     "Kingma & Ba with bias correction and L2 weight decay folded into g (see the class "
     "and step docstrings).",
     "p = nn.Parameter(ndl.Tensor([1.0])); p.grad = ndl.Tensor([1.0])\n"
     "ndl.optim.Adam([p], lr=0.1).step(); print(p)  # 0.9: Adam's first step is lr * sign(g)"),
    ("hw2.data.transforms", "needle/data/data_transforms.py",
     "RandomFlipHorizontal.__call__, RandomCrop.__call__",
     "Images are H x W x C NumPy arrays; flip along W with probability p; crop = shift by a "
     "random (dx, dy) within the padding, zeros filling in.",
     "img = np.arange(6.0).reshape(1, 3, 2)\n"
     "print(ndl.data.RandomFlipHorizontal(p=1.0)(img)[0, :, 0])"),
    ("hw2.data.dataloader", "needle/data/data_basic.py", "DataLoader._new_ordering",
     "The batches of indices for one epoch: in order, or a fresh permutation per epoch "
     "when shuffle.",
     "train = ndl.data.digits_datasets()[0]\n"
     "print(len(list(ndl.data.DataLoader(train, batch_size=500))))"),
    ("hw2.mlp_resnet", "apps/mlp_resnet.py", "ResidualBlock, MLPResNet, epoch, train_mnist",
     "The course's MLP ResNet (see the docstrings for the layer order) and its training loop.",
     "import apps.mlp_resnet as mr\n\nprint(mr.MLPResNet(64, hidden_dim=32, num_blocks=1))"),
]

ND, NP = "needle/backend_ndarray/ndarray.py", "needle/backend_ndarray/ndarray_backend_numpy.py"
HW3: List[Q] = [
    ("hw3.ndarray.views", f"{ND}, {NP}",
     "NDArray.reshape, permute, broadcast_to, _view_of (indexing); backend compact",
     "Views change (shape, strides, offset) only: reshape of a compact array gets compact "
     "strides; permute reorders shape and strides; broadcast_to gives stride 0 to new and "
     "size-1 axes; a slice a:b:s adds a * stride to the offset and multiplies the stride by s; "
     "compact copies a view into row-major order.",
     "from needle.backend_ndarray import NDArray\n\n"
     "v = NDArray(np.arange(12.0).reshape(3, 4))[1:, ::2].permute((1, 0))\n"
     "print(v.shape, v.strides, v.offset, v.compact().numpy())"),
    ("hw3.ndarray.flip", ND, "NDArray.flip",
     "A view: a negative stride on each flipped axis and the offset moved to its last element.",
     "from needle.backend_ndarray import NDArray\n\n"
     "print(NDArray(np.arange(6.0).reshape(2, 3)).flip((1,)).numpy())"),
    ("hw3.ndarray.setitem", NP, "ewise_setitem, scalar_setitem",
     "Write a compact source (or a scalar) through the view (shape, strides, offset) of out.",
     "from needle.backend_ndarray import NDArray\n\n"
     "a = NDArray(np.zeros((3, 4)))\na[1:, ::2] = 7.0\nprint(a.numpy())"),
    ("hw3.ndarray.reductions", f"{ND}, {NP}", "NDArray._reduce, reduce_sum, reduce_max",
     "Move the reduced axes last, compact, reduce each contiguous block of reduce_size "
     "elements (sum accumulates in the output dtype; max of an empty block is an error).",
     "from needle.backend_ndarray import NDArray\n\n"
     "print(NDArray(np.arange(24.0).reshape(2, 3, 4)).sum(axis=(0, 2)).numpy())"),
    ("hw3.ndarray.matmul", f"{ND}, {NP}", "NDArray.__matmul__, backend matmul",
     "(..., m, n) @ (n, p) with batch axes broadcast; the backend multiplies compact (m, n) "
     "and (n, p) buffers.",
     "from needle.backend_ndarray import NDArray\n\n"
     "print((NDArray(np.ones((2, 3))) @ NDArray(np.ones((3, 2)))).numpy())"),
    ("hw3.ndarray.matmul_tiled", f"{ND}, {NP}", "NDArray._matmul_tiled, backend matmul_tiled",
     "Shapes whose m, n, p are multiples of the tile go through the tiled layout: each operand "
     "as (rows/t, cols/t, t, t) tiles, multiplied tile by tile.",
     "from needle.backend_ndarray import NDArray\n\n"
     "a = NDArray(np.random.randn(8, 8))\n"
     "print(np.allclose((a @ a).numpy(), a.numpy() @ a.numpy()))"),
    ("hw3.ndarray.gather_scatter", NP, "take_rows, scatter_add_rows",
     "Embedding lookups: rows of a table gathered by index; their gradient adds each row back "
     "at its index (repeated indices accumulate).",
     "table = ndl.Tensor(np.arange(6.0).reshape(3, 2))\n"
     "print(ndl.ops.embedding(table, ndl.Tensor([2, 0, 2], dtype='int64')))"),
]

CONV, TUPLE, SEQ = "needle/ops/ops_conv.py", "needle/ops/ops_tuple.py", "needle/nn/nn_sequence.py"
HW4: List[Q] = [
    ("hw4.ops.dilate", CONV, "Dilate.compute, UnDilate.compute",
     "`dilate(a, axes, d)` inserts d zeros after every element along each axis in `axes` (shape "
     "n -> n * (d + 1)); `undilate` keeps every (d + 1)-th element, its inverse and gradient.",
     "print(ops.dilate(ndl.Tensor(np.arange(4.0).reshape(2, 2)), axes=(0, 1), dilation=1))"),
    ("hw4.ops.stack_split", TUPLE, "Stack.compute/gradient, Split.compute/gradient",
     "`stack(tensors, axis)` makes a new axis of length len(tensors) at `axis` (all shapes "
     "equal); `split(a, axis)` is its inverse, a TensorTuple; each is the other's gradient.",
     "parts = ops.split(ops.stack([ndl.Tensor(np.ones(2)), ndl.Tensor(np.zeros(2))], axis=0), "
     "axis=0)\nprint(len(parts), parts[1])"),
    ("hw4.ops.conv", CONV, "Conv.compute, Conv.gradient",
     "NHWC input (N, H, W, C_in) and (K, K, C_in, C_out) weight, zero padding `padding` on H "
     "and W, then stride `stride`: (N, (H + 2p - K) // s + 1, ..., C_out), by im2col (strided "
     "view + one matmul). Gradient: convolutions of the (dilated, for stride > 1) out_grad.",
     "x = ndl.Tensor(np.random.randn(2, 6, 6, 3))\nw = ndl.Tensor(np.random.randn(3, 3, 3, 4))"
     "\nprint(ops.conv(x, w, stride=2, padding=1).shape)"),
    ("hw4.nn.conv", "needle/nn/nn_conv.py", "Conv.__init__, Conv.forward",
     "NCHW in and out, 'same' padding K // 2; weight (K, K, C_in, C_out) kaiming_uniform with "
     "fan_in = C_in * K * K, fan_out = C_out * K * K; bias uniform in +-1/sqrt(C_in * K * K).",
     "print(nn.Conv(3, 4, 3)(ndl.Tensor(np.random.randn(2, 3, 8, 8), dtype='float32')).shape)"),
    ("hw4.nn.rnn", SEQ, "RNNCell.step, LSTMCell.step, RNN.forward, LSTM.forward",
     "Sequence-first (T, B, input) inputs; h0 (and c0) default to zeros (num_layers, B, hidden); "
     "LSTM gates in the order i, f, g, o; returns (output (T, B, hidden), final states).",
     "out, (h, c) = nn.LSTM(3, 5, num_layers=2)(ndl.Tensor(np.random.randn(7, 2, 3), "
     "dtype='float32'))\nprint(out.shape, h.shape, c.shape)"),
    ("hw4.nn.embedding", SEQ, "Embedding.forward",
     "Indices (T, B) of a float or int tensor -> (T, B, embedding_dim): row x of the weight "
     "(one-hot times weight, or a gather), differentiable in the weight.",
     "print(nn.Embedding(10, 4)(ndl.Tensor(np.array([[1, 2, 3]]), dtype='float32')).shape)"),
    ("hw4.nn.transformer", "needle/nn/nn_transformer.py",
     "MultiHeadAttention, AttentionLayer, TransformerLayer, Transformer (forward)",
     "Pre-norm layers; softmax(QK^T / sqrt(d_head)) V with a causal mask when `causal`; "
     "learned positional embedding; (T, B, D) in and out unless batch_first.",
     "model = nn.Transformer(8, 16, 2, num_head=2, dim_head=4)\n"
     "y, _ = model(ndl.Tensor(np.random.randn(5, 3, 8), dtype='float32'))\nprint(y.shape)"),
    ("hw4.data.ptb", "needle/data/datasets/ptb_dataset.py",
     "Dictionary.add_word, Corpus.tokenize, batchify, get_batch",
     "Words get ids in order of first appearance, '<eos>' after every line; batchify cuts the "
     "stream into (len // B, B) columns; get_batch(i, bptt) gives rows [i, i + L) and targets "
     "rows [i + 1, i + 1 + L) flattened.",
     "from needle.data.datasets.ptb_dataset import batchify, get_batch\n"
     "batches = batchify(np.arange(20), batch_size=4)\nx, y = get_batch(batches, 0, bptt=3)\n"
     "print(batches.shape, x.shape, y.shape)"),
    ("hw4.models", "apps/models.py, apps/simple_ml.py",
     "ResNet9, LanguageModel, epoch_general_cifar10, epoch_general_ptb",
     "The course's ResNet9 (ConvBN blocks with two residuals) and a language model "
     "(Embedding, RNN/LSTM/Transformer, Linear); the epoch loops return (mean accuracy, mean "
     "loss) and step the optimizer when one is given.",
     "from apps.models import LanguageModel\nlm = LanguageModel(8, 20, 16, seq_model='lstm')\n"
     "print(lm(ndl.Tensor(np.random.randint(0, 20, (6, 2)), dtype='float32'))[0].shape)"),
]

COMM = "needle/parallel/comm"
COLLECTIVES: List[Q] = [
    ("collectives.reference", f"{COMM}/reference.py",
     "reduce_scatter_segments, ring_allgather, recursive_doubling_allreduce",
     "Pure functions over a list of per-rank arrays: what every rank holds after each "
     "collective, step by step as the ring (Patarasuk & Yuan 2009) and recursive doubling "
     "(Thakur et al. 2005) move the data. Tested exactly against sums of the inputs.",
     "from needle.parallel.comm import reference\n"
     "xs = [np.full(4, r + 1.0) for r in range(3)]\n"
     "print(reference.recursive_doubling_allreduce(xs)[0])"),
    ("collectives.mpi", f"{COMM}/ring.py, {COMM}/latency_bound.py",
     "ring_allreduce_naive, ring_reduce_scatter, ring_gather, recursive_doubling_allreduce, "
     "binomial_broadcast, binomial_reduce",
     "The same algorithms over point-to-point messages on a Channel (generators that yield "
     "sends and receives); results must equal the references bit for bit.",
     "from needle.parallel import virtual\n"
     "print(virtual.run(4, lambda comm: comm.allreduce(np.arange(6.0) * (comm.rank + 1)))[0])"),
]

CUDA: List[Q] = [
    ("hw3.cuda.backend", "needle/backend_cuda/kernels/{strided,matmul,reduce}.cu, "
     "needle/backend_cuda/ndarray_backend_cuda.py",
     "strided_index, compact, ewise_setitem, scalar_setitem, matmul_naive, matmul_tiled, "
     "reduce_rows_thread, reduce_rows_block (kernels) and their launches",
     "The kernels' contracts are the comments above them in the .cu files (a region there is "
     "`// BEGIN YOUR SOLUTION (hw3.cuda.backend)`); the launches are in the Python backend. "
     "Without a GPU the tests run on needle's CUDA emulator (NEEDLE_CUDA_EMULATOR=1).",
     "if ndl.cuda().enabled():  # a GPU, or the emulator (a C++ compiler is needed)\n"
     "    x = ndl.Tensor(np.arange(12.0).reshape(3, 4), device=ndl.cuda(), dtype='float32')\n"
     "    print((x.transpose() @ x).numpy())"),
]


# Exercises a question's demonstration cell runs beyond its graded tests' requirements (the
# question names them; tests/test_notebooks.py checks each demonstration against its question).
DEMO_NEEDS = {
    "hw3.cuda.backend": ("hw1.autograd.make_from_op", "hw1.ops.transpose"),
}


def _cell(kind: str, text: str) -> dict:
    cell: Dict[str, Any]  # a notebook cell: nbformat's keys, values of several types
    cell = {"cell_type": kind, "id": "q" + hashlib.sha1(text.encode()).hexdigest()[:10],
            "metadata": {"tags": [MARK]}, "source": text.splitlines(True)}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def _blank_after_imports(code: str) -> str:
    """``code`` with a blank line after its leading imports (isort's layout, ruff-clean)."""
    lines = code.split("\n")
    n = 0
    while n < len(lines) and lines[n].startswith(("import ", "from ")):
        n += 1
    if n == 0 or n == len(lines) or not lines[n].strip():
        return code
    return "\n".join(lines[:n] + [""] + lines[n:])


def questions(qs: List[Q], path_cell: str = PATH) -> List[dict]:
    """The cells of the questions: statement, grading cell, demonstration."""
    cells = [_cell("markdown", "## Part 1: the graded questions\n\nWrite each function where "
                   "its `### BEGIN YOUR SOLUTION (<exercise>)` marker is, then run the grading "
                   "cell: it runs that exercise's graded tests (the same as "
                   "`python -m course.grade --exercise <exercise>` in a terminal) and fails "
                   "until they pass. The full spec is the docstring next to the stub."),
             _cell("code", path_cell), _cell("code", SETUP)]
    for n, (ex, where, func, spec, demo) in enumerate(qs, 1):
        needs = ", ".join(f"`{r}`" for r in sorted(requirements(ex)))
        needs = f"\n\nIts graded tests also need written: {needs}." if needs else ""
        extra = sorted(set(DEMO_NEEDS.get(ex, ())) - requirements(ex))
        if extra:
            uses = ", ".join(f"`{r}`" for r in extra)
            needs += f"\n\nIts demonstration also uses: {uses}."
        cells.append(_cell("markdown", f"### Question {n}: `{func}` ({ex})\n\n"
                           f"File: `{where}`. Exercise: `{ex}`.\n\n{spec}{needs}"))
        cells.append(_cell("code", f'grade("{ex}")'))
        cells.append(_cell("code", _blank_after_imports(demo)))
    cells.append(_cell("markdown", "## Part 2: putting it together"))
    return cells


def rewrite(path: Path, qs: List[Q], path_cell: str = PATH) -> None:
    """Replace the generated cells of ``path`` (after its first cell) by fresh ones."""
    nb = json.loads(path.read_text())
    kept = [c for c in nb["cells"] if MARK not in c.get("metadata", {}).get("tags", [])]
    nb["cells"] = kept[:1] + questions(qs, path_cell) + kept[1:]
    nb["nbformat"], nb["nbformat_minor"] = 4, max(nb.get("nbformat_minor", 0), 5)
    for i, cell in enumerate(nb["cells"]):
        cell.setdefault("id", f"cell{i}")
    path.write_text(json.dumps(nb, indent=1) + "\n")


if __name__ == "__main__":
    rewrite(ROOT / "notebooks" / "hw1_autograd.ipynb", HW1, NP_PATH)
    rewrite(ROOT / "notebooks" / "hw2_nn_training.ipynb", HW2, NP_PATH)
    rewrite(ROOT / "notebooks" / "hw3_ndarray.ipynb", HW3)
    rewrite(ROOT / "notebooks" / "hw4_cnn_rnn_transformer.ipynb", HW4)
    rewrite(ROOT / "notebooks" / "hw_collectives.ipynb", COLLECTIVES)
    rewrite(ROOT / "notebooks" / "hw3_cuda_kernels.ipynb", CUDA, CUDA_PATH)
