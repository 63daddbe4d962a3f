"""Writes the question cells of the homework notebooks (hw1-hw4, CUDA, collectives).

    python -m course.notebook_questions   # rewrites the notebooks' question part

Each question: what to implement (the files and functions holding the exercise's solution
regions, with their docstrings, read from the code by ``course/region_docs.py``), a cell
grading it (``grade("<exercise>")``, course/notebook.py) and a short demonstration. Here live
only the question order and the demonstrations. The notebooks' own cells after the questions
(the walkthrough) are kept.
"""
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .exercises import requirements
from .region_docs import Asked, asked_functions

ROOT = Path(__file__).resolve().parents[1]
MARK = "course.notebook_questions"  # metadata tag of the generated cells
Q = Tuple[str, str]  # exercise, demonstration

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


def gradcheck(f, *shapes, low=0.5, high=1.5, eps=1e-6, seed=0, tol=1e-6):
    \"\"\"Print max |op gradient - central differences| of y = f(*inputs), one op on the
    inputs, and whether it is below ``tol``.

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
    verdict = "ok" if err < tol else "WRONG: check the gradient"
    print(f"max |gradient - numerical gradient| = {err:.1e}, threshold {tol:g}: {verdict}")
"""

# The questions of each notebook in the course's order, each with its demonstration; the notebook
# asks them so that an exercise's requirements come before it (``in_requirement_order``).
HW1: List[Q] = [
    ("hw1.ops.multiply", "gradcheck(lambda a, b: a * b, (3, 4), (3, 4))"),
    ("hw1.ops.power", "gradcheck(lambda a, b: a ** b, (3,), (3,))"),
    ("hw1.ops.power_scalar", "gradcheck(lambda a: a ** 3, (2, 3))"),
    ("hw1.ops.divide", "gradcheck(lambda a, b: a / b, (2, 3), (2, 3))"),
    ("hw1.ops.divide_scalar", "gradcheck(lambda a: a / 4.0, (2, 3))"),
    ("hw1.ops.log", "gradcheck(ops.log, (4,))"),
    ("hw1.ops.exp", "gradcheck(ops.exp, (4,))"),
    ("hw1.ops.relu", "gradcheck(ops.relu, (5,), low=-1.0)"),
    ("hw1.ops.tanh", "gradcheck(ops.tanh, (4,))"),
    ("hw1.ops.transpose",
     "print(ops.transpose(ndl.Tensor(np.zeros((2, 3, 4))), (0, 2)).shape)  # (4, 3, 2)"),
    ("hw1.ops.reshape", "print(ops.reshape(ndl.Tensor(np.arange(6.0)), (2, -1)))"),
    ("hw1.ops.broadcast_to", "gradcheck(lambda a: ops.broadcast_to(a, (3, 2, 4)), (2, 1))"),
    ("hw1.ops.summation", "gradcheck(lambda a: ops.summation(a, (1,)), (3, 4))"),
    ("hw1.ops.matmul", "gradcheck(lambda a, b: a @ b, (2, 3, 4), (4, 5))"),
    ("hw1.autograd.make_from_op",
     "x = ndl.Tensor([1.0, 2.0]); y = x * x\nprint(type(y.op).__name__, y.requires_grad)"),
    ("hw1.autograd.topo_sort",
     "x = ndl.Tensor([1.0]); y = ops.exp(x) + x\n"
     "print([type(n.op).__name__ if n.op else 'leaf' for n in ndl.autograd.find_topo_sort([y])])"),
    ("hw1.autograd.compute_gradient",
     "x = ndl.Tensor([3.0]); y = x * x + x\ny.backward()\nprint(x.grad)  # 2x + 1 = 7"),
    ("hw1.simple_ml.softmax_loss",
     "from apps import simple_ml\nZ = ndl.Tensor(np.array([[2.0, 0.0], [0.0, 2.0]]))\n"
     "print(simple_ml.softmax_loss(Z, ndl.Tensor(np.eye(2))))"),
    ("hw1.simple_ml.nn_epoch",
     "import apps.simple_ml as sm\n\nprint(sm.nn_epoch.__doc__.splitlines()[0])"),
]

HW2: List[Q] = [
    ("hw2.ops.logsumexp",
     "print(ops.logsumexp(ndl.Tensor([[1e4, 1e4]]), (1,)))  # 1e4 + log 2, no overflow"),
    ("hw2.ops.logsoftmax",
     "print(ops.exp(ops.logsoftmax(ndl.Tensor([[1.0, 2.0, 3.0]]))).numpy().sum())  # 1"),
    ("hw2.init.rand", "np.random.seed(0); print(ndl.init.rand(2, 2))"),
    ("hw2.init.fan", "np.random.seed(0); print(ndl.init.kaiming_uniform(3, 2))"),
    ("hw2.nn.linear",
     "np.random.seed(1); print(nn.Linear(3, 2)(ndl.Tensor(np.ones((4, 3)))).shape)"),
    ("hw2.nn.sequential", "print(nn.Sequential(nn.ReLU(), nn.ReLU())(ndl.Tensor([-1.0, 2.0])))"),
    ("hw2.nn.softmax_loss",
     "print(nn.SoftmaxLoss()(ndl.Tensor(np.zeros((2, 4))), ndl.Tensor([0, 3])))  # log 4"),
    ("hw2.nn.batchnorm1d",
     "bn = nn.BatchNorm1d(3); y = bn(ndl.Tensor(np.random.randn(8, 3)))\n"
     "print(y.numpy().mean(0).round(6), bn.running_mean)"),
    ("hw2.nn.layernorm1d",
     "print(nn.LayerNorm1d(4)(ndl.Tensor(np.arange(8.0).reshape(2, 4))).numpy().round(4))"),
    ("hw2.nn.dropout", "d = nn.Dropout(0.5); d.eval(); print(d(ndl.Tensor([1.0, 2.0])))"),
    ("hw2.optim.sgd",
     "p = nn.Parameter(ndl.Tensor([1.0])); p.grad = ndl.Tensor([1.0])\n"
     "ndl.optim.SGD([p], lr=0.1).step(); print(p)  # 0.9"),
    ("hw2.optim.adam",
     "p = nn.Parameter(ndl.Tensor([1.0])); p.grad = ndl.Tensor([1.0])\n"
     "ndl.optim.Adam([p], lr=0.1).step(); print(p)  # 0.9: Adam's first step is lr * sign(g)"),
    ("hw2.data.transforms",
     "img = np.arange(6.0).reshape(1, 3, 2)\n"
     "print(ndl.data.RandomFlipHorizontal(p=1.0)(img)[0, :, 0])"),
    ("hw2.data.dataloader",
     "train = ndl.data.digits_datasets()[0]\n"
     "print(len(list(ndl.data.DataLoader(train, batch_size=500))))"),
    ("hw2.mlp_resnet",
     "import apps.mlp_resnet as mr\n\nprint(mr.MLPResNet(64, hidden_dim=32, num_blocks=1))"),
]

ND_IMPORT = "from needle.backend_ndarray import NDArray\n\n"
HW3: List[Q] = [
    ("hw3.ndarray.views",
     ND_IMPORT + "v = NDArray(np.arange(12.0).reshape(3, 4))[1:, ::2].permute((1, 0))\n"
     "print(v.shape, v.strides, v.offset, v.compact().numpy())"),
    ("hw3.ndarray.flip",
     ND_IMPORT + "print(NDArray(np.arange(6.0).reshape(2, 3)).flip((1,)).numpy())"),
    ("hw3.ndarray.setitem",
     ND_IMPORT + "a = NDArray(np.zeros((3, 4)))\na[1:, ::2] = 7.0\nprint(a.numpy())"),
    ("hw3.ndarray.reductions",
     ND_IMPORT + "print(NDArray(np.arange(24.0).reshape(2, 3, 4)).sum(axis=(0, 2)).numpy())"),
    ("hw3.ndarray.matmul",
     ND_IMPORT + "print((NDArray(np.ones((2, 3))) @ NDArray(np.ones((3, 2)))).numpy())"),
    ("hw3.ndarray.matmul_tiled",
     ND_IMPORT + "a = NDArray(np.random.randn(8, 8))\n"
     "print(np.allclose((a @ a).numpy(), a.numpy() @ a.numpy()))"),
    ("hw3.ndarray.gather_scatter",
     "table = ndl.Tensor(np.arange(6.0).reshape(3, 2))\n"
     "print(ndl.ops.embedding(table, ndl.Tensor([2, 0, 2], dtype='int64')))"),
]

HW4: List[Q] = [
    ("hw4.ops.dilate",
     "print(ops.dilate(ndl.Tensor(np.arange(4.0).reshape(2, 2)), axes=(0, 1), dilation=1))"),
    ("hw4.ops.stack_split",
     "parts = ops.split(ops.stack([ndl.Tensor(np.ones(2)), ndl.Tensor(np.zeros(2))], axis=0), "
     "axis=0)\nprint(len(parts), parts[1])"),
    ("hw4.ops.conv",
     "x = ndl.Tensor(np.random.randn(2, 6, 6, 3))\nw = ndl.Tensor(np.random.randn(3, 3, 3, 4))"
     "\nprint(ops.conv(x, w, stride=2, padding=1).shape)"),
    ("hw4.nn.conv",
     "print(nn.Conv(3, 4, 3)(ndl.Tensor(np.random.randn(2, 3, 8, 8), dtype='float32')).shape)"),
    ("hw4.nn.rnn",
     "out, (h, c) = nn.LSTM(3, 5, num_layers=2)(ndl.Tensor(np.random.randn(7, 2, 3), "
     "dtype='float32'))\nprint(out.shape, h.shape, c.shape)"),
    ("hw4.nn.embedding",
     "print(nn.Embedding(10, 4)(ndl.Tensor(np.array([[1, 2, 3]]), dtype='float32')).shape)"),
    ("hw4.nn.transformer",
     "model = nn.Transformer(8, 16, 2, num_head=2, dim_head=4)\n"
     "y, _ = model(ndl.Tensor(np.random.randn(5, 3, 8), dtype='float32'))\nprint(y.shape)"),
    ("hw4.data.ptb",
     "from needle.data.datasets.ptb_dataset import batchify, get_batch\n"
     "batches = batchify(np.arange(20), batch_size=4)\nx, y = get_batch(batches, 0, bptt=3)\n"
     "print(batches.shape, x.shape, y.shape)"),
    ("hw4.models",
     "from apps.models import LanguageModel\nlm = LanguageModel(8, 20, 16, seq_model='lstm')\n"
     "print(lm(ndl.Tensor(np.random.randint(0, 20, (6, 2)), dtype='float32'))[0].shape)"),
]

COLLECTIVES: List[Q] = [
    ("collectives.reference",
     "from needle.parallel.comm.algorithms import reference\n"
     "xs = [np.full(4, r + 1.0) for r in range(3)]\n"
     "print(reference.recursive_doubling_allreduce(xs)[0])"),
    ("collectives.mpi",
     "from needle.parallel import virtual\n"
     "print(virtual.run(4, lambda comm: comm.allreduce(np.arange(6.0) * (comm.rank + 1)))[0])"),
]

CUDA: List[Q] = [
    ("hw3.cuda.backend",
     "if ndl.cuda().enabled():  # a GPU, or the emulator (a C++ compiler is needed)\n"
     "    x = ndl.Tensor(np.arange(12.0).reshape(3, 4), device=ndl.cuda(), dtype='float32')\n"
     "    print((x.transpose() @ x).numpy())"),
]

# What a question says beyond its functions' docstrings: how its tests run, not what to write.
NOTES = {
    "collectives.reference": "The references are pure functions over a list of per-rank "
    "arrays, tested exactly against sums of the inputs.",
    "collectives.mpi": "The same algorithms over point-to-point messages on a Channel "
    "(generators that yield sends and receives); results must equal the references bit for bit.",
    "hw3.cuda.backend": "The kernels' contracts are the comments above them in the .cu files (a "
    "region there is `// BEGIN YOUR SOLUTION (hw3.cuda.backend)`); the launches are in the "
    "Python backend. Without a GPU the tests run on needle's CUDA emulator "
    "(NEEDLE_CUDA_EMULATOR=1).",
}

# Exercises a question's demonstration cell runs beyond its graded tests' requirements (the
# question names them; tests/test_notebooks.py checks each demonstration against its question).
DEMO_NEEDS = {
    "hw3.cuda.backend": ("hw1.autograd.make_from_op", "hw1.ops.transpose"),
}


def _cell(kind: str, text: str) -> dict:
    cell: Dict[str, Any] = {"cell_type": kind,
                            "id": "q" + hashlib.sha1(text.encode()).hexdigest()[:10],
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


def in_requirement_order(qs: List[Q]) -> List[Q]:
    """``qs`` with each question after the questions of ``qs`` it requires (transitively),
    otherwise in the given order: answered in order, every grading cell can pass."""
    index = {ex: i for i, (ex, _) in enumerate(qs)}
    out: List[Q] = []

    def visit(i: int) -> None:
        if qs[i] not in out:
            for req in sorted(index[r] for r in requirements(qs[i][0]) if r in index):
                visit(req)
            out.append(qs[i])
    for i in range(len(qs)):
        visit(i)
    return out


def _quote(doc: str) -> str:
    return "\n".join(("> " + line).rstrip() for line in doc.splitlines())


def statement(n: int, ex: str, asked: List[Asked]) -> str:
    """The markdown of question ``n``: the functions to write, by file, with their docstrings."""
    names = ", ".join(dict.fromkeys(a.qualname for a in asked))  # a kernel and its launch
    parts = [f"### Question {n}: `{names}` ({ex})", f"Write the regions marked `{ex}` in the "
             "functions below; their docstrings, quoted here, are the spec."]
    classes = set()
    for i, a in enumerate(asked):
        if i == 0 or asked[i - 1].path != a.path:
            parts.append(f"File: `{a.path}`")
        owner = a.qualname.rpartition(".")[0]
        if a.class_doc and (a.path, owner) not in classes:
            classes.add((a.path, owner))
            parts.append(f"`{owner}`:\n\n{_quote(a.class_doc)}")
        parts.append(f"`{a.qualname}`:" + (f"\n\n{_quote(a.doc)}" if a.doc else ""))
    if ex in NOTES:
        parts.append(NOTES[ex])
    needs = ", ".join(f"`{r}`" for r in sorted(requirements(ex)))
    if needs:
        parts.append(f"Its graded tests also need written: {needs}.")
    extra = sorted(set(DEMO_NEEDS.get(ex, ())) - requirements(ex))
    if extra:
        parts.append(f"Its demonstration also uses: {', '.join(f'`{r}`' for r in extra)}.")
    return "\n\n".join(parts)


def questions(qs: List[Q], path_cell: str = PATH) -> List[dict]:
    """The cells of the questions, requirements first: statement, grading cell, demonstration."""
    cells = [_cell("markdown", "## Part 1: the graded questions\n\nWrite each function where "
                   "its `### BEGIN YOUR SOLUTION (<exercise>)` marker is, then run the grading "
                   "cell: it runs that exercise's graded tests (the same as "
                   "`python -m course.grade --exercise <exercise>` in a terminal) and fails "
                   "until they pass. The full spec is the docstring next to the stub."),
             _cell("code", path_cell), _cell("code", SETUP)]
    asked = asked_functions()
    for n, (ex, demo) in enumerate(in_requirement_order(qs), 1):
        cells.append(_cell("markdown", statement(n, ex, asked[ex])))
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


# notebook file name -> its questions and its path cell
NOTEBOOKS: Dict[str, Tuple[List[Q], str]] = {
    "hw1_autograd.ipynb": (HW1, NP_PATH),
    "hw2_nn_training.ipynb": (HW2, NP_PATH),
    "hw3_ndarray.ipynb": (HW3, PATH),
    "hw4_cnn_rnn_transformer.ipynb": (HW4, PATH),
    "hw_collectives.ipynb": (COLLECTIVES, PATH),
    "hw3_cuda_kernels.ipynb": (CUDA, CUDA_PATH),
}

if __name__ == "__main__":
    for name, (qs, path_cell) in NOTEBOOKS.items():
        rewrite(ROOT / "notebooks" / name, qs, path_cell)
