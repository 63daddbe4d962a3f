"""Kernel sources, template instantiations and launch shapes (pure Python: no CuPy, no GPU).

The CUDA C lives in ``kernels/*.cu``, but for ewise.cu's functors, which ``functors`` writes
from the primitive table's expressions. This module says which template instantiations exist
(``name_expressions``: the same strings CuPy's ``RawModule.get_function`` and the NVRTC
compile check use) and how each kernel is launched, so both can be tested without a GPU.
"""
import ast
import functools
import math
import re
from pathlib import Path
from typing import List, Tuple, TypedDict

# pure data (the primitive table and the dtypes), the backend_ndarray modules this backend reads
from ..backend_ndarray import primitives as P
from ..backend_ndarray.dtypes import FLOATS as FLOAT_DTYPES
from .c_expr import to_c

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
# (FAST_FILES, the backend's default reductions, softmax and layer norm, are not in a student
# release: beside reduce.cu's, softmax.cu's and layernorm.cu's exercises they would be their
# answers; without them the course's kernels run)
FAST_FILES = ("reduce_fast.cu", "norm_fast.cu")
KERNEL_FILES = tuple(f for f in (
    "strided.cu", "ewise.cu", "ewise_strided.cu", "reduce.cu", "reduce_fast.cu", "matmul.cu",
    "softmax.cu", "conv.cu", "batchnorm.cu", "layernorm.cu", "norm_fast.cu", "dropout.cu",
    "multi_tensor.cu") if (KERNEL_DIR / f).is_file())

CTYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
         "float64": "double", "bool": "bool"}
ACC_DTYPE = {"float16": "float32", "bfloat16": "float32", "float32": "float32",
             "float64": "float64"}
# Copies only move bits: one instantiation per element width serves every dtype.
BITS_CTYPE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}

MAX_DIMS = 32  # NDL_MAX_DIMS in strided.cu
BLOCK = 256  # threads per block for elementwise kernels
MATMUL_TILE = (128, 128)  # BM, BN in matmul.cu; 256 threads per block
NVRTC_OPTIONS = ("--std=c++17",)


# The line a student-release stub leaves in a kernel region (course/make_student.py writes it):
# the rest of the line names the exercise and what to write.
KERNEL_STUB = "// NOT WRITTEN: "


def source(filename: str) -> str:
    """The CUDA C source of ``kernels/<filename>``; NotImplementedError naming the exercise
    where a region of it is a student-release stub (it would compile to a kernel doing nothing)."""
    text = (KERNEL_DIR / filename).read_text()
    for line in text.splitlines():
        if line.strip().startswith(KERNEL_STUB):
            raise NotImplementedError(line.strip()[len(KERNEL_STUB):])
    if filename == "ewise_strided.cu":  # strided_index (the exercise) and the functors first
        return source("strided.cu") + source("ewise.cu") + text
    return text + functors() if filename == "ewise.cu" else text


def named_source(filename: str) -> str:
    """``source(filename)`` after a ``#line`` directive naming its file, as the runtime loads
    it: compilers, and the emulator's messages, say which file a line is in."""
    return f'#line 1 "{KERNEL_DIR / filename}"\n' + source(filename)


def _elementwise_primitives() -> List[P.Primitive]:
    """The rows of ``primitives.ELEMENTWISE`` as primitives, read when called (so that a row
    added to the table reaches the source and its instantiations)."""
    return [q for row in P.ELEMENTWISE for q in P.elementwise(*row)]


def functors() -> str:
    """ewise.cu's functors, one per elementwise op (``ndl::Add`` for ``add``): the table's
    expression in C (the statement language's ``to_c``), for float and double operands."""
    out = ["namespace ndl {"]
    for name, _, expr in P.ELEMENTWISE:
        args = ("x", "y") if "{1}" in expr else ("x",)
        c = to_c(ast.parse(expr.format(*args), mode="eval").body)
        out.append(f"struct {name.capitalize()} {{")
        for acc, suffix in (("float", "f"), ("double", "")):  # expf for float, exp for double
            params = ", ".join(f"{acc} {a}" for a in args)
            body = re.sub(r"\b([a-z]\w*)\(", rf"\1{suffix}(", c)
            out.append(f"  __device__ auto operator()({params}) const {{ return {body}; }}")
        out.append("};")
    return "\n".join(out + ["}  // namespace ndl", ""])


def include_options() -> Tuple[str, ...]:
    """Compiler options that let a kernel file ``#include "common.cuh"``."""
    return ("-I" + str(KERNEL_DIR),)


# ---------------------------------------------------------------------- instantiation names
def strided_name(kernel: str, itemsize: int) -> str:
    """``compact<unsigned int>`` and friends, by element width in bytes."""
    return f"{kernel}<{BITS_CTYPE[itemsize]}>"


@functools.lru_cache(maxsize=None)
def elementwise_name(p: P.Primitive, dtype: str) -> str:
    """The ewise.cu instantiation (ewise_binary, scalar_binary or ewise_unary with the op's
    functor) that runs elementwise primitive ``p`` on ``dtype``."""
    t, functor = CTYPE[dtype], f"ndl::{p.op.capitalize()}"
    if p.family == "unary":
        return f"ewise_unary<{t}, {functor}>"
    out = "bool" if p.family == "compare" else t
    return f"{'scalar' if p.scalar >= 0 else 'ewise'}_binary<{t}, {out}, {functor}>"


@functools.lru_cache(maxsize=None)
def strided_binary_name(p: P.Primitive, dtype: str) -> str:
    """The ewise_strided.cu instantiation running binary primitive ``p`` on strided views."""
    out = "bool" if p.family == "compare" else CTYPE[dtype]
    return f"ewise_strided<{CTYPE[dtype]}, {out}, ndl::{p.op.capitalize()}>"


def binary_name(op: str, dtype: str, scalar: bool = False) -> str:
    """The ewise_binary / scalar_binary instantiation for ``op`` on ``dtype``."""
    return elementwise_name(P.TABLE[("scalar_" if scalar else "ewise_") + op], dtype)


def unary_name(op: str, dtype: str) -> str:
    """The ewise_unary instantiation for ``op`` on ``dtype``."""
    return elementwise_name(P.TABLE["ewise_" + op], dtype)


def astype_name(src: str, dst: str) -> str:
    """The float-to-float conversion kernel."""
    return f"ewise_astype<{CTYPE[src]}, {CTYPE[dst]}>"


def reduce_name(kind: str, op: str, src: str, dst: str) -> str:
    """``reduce_rows_{thread,block}<TIn, TOut, ndl::{Sum,Max}Op>``."""
    return f"reduce_rows_{kind}<{CTYPE[src]}, {CTYPE[dst]}, ndl::{op.capitalize()}Op>"


def fast_reduce_name(kind: str, op: str, src: str, dst: str) -> str:
    """reduce_fast.cu's ``reduce_{rows_warp,rows_wide,cols}<TIn, TOut, ndl::{Sum,Max}Op>``."""
    return f"reduce_{kind}<{CTYPE[src]}, {CTYPE[dst]}, ndl::{op.capitalize()}Op>"


def typed_name(kernel: str, dtype: str) -> str:
    """A kernel templated on one element type, e.g. ``softmax_rows<float>``."""
    return f"{kernel}<{CTYPE[dtype]}>"


def pair_name(kernel: str, src: str, dst: str) -> str:
    """A kernel templated on an input and an output type, e.g. ``column_sum<__half, float>``."""
    return f"{kernel}<{CTYPE[src]}, {CTYPE[dst]}>"


def name_expressions(filename: str, dtype: str = "") -> List[str]:
    """Every instantiation in ``filename`` (for one dtype, or all when ``dtype`` is empty)."""
    dtypes = (dtype,) if dtype else FLOAT_DTYPES
    if filename == "strided.cu":
        return [strided_name(k, w) for k in ("compact", "ewise_setitem", "scalar_setitem")
                for w in BITS_CTYPE]
    if filename == "ewise.cu":
        names = []
        for dt in dtypes:
            names += [elementwise_name(p, dt) for p in _elementwise_primitives()]
            names += [typed_name("ewise_where", dt)]
            names += [astype_name(dt, d2) for d2 in FLOAT_DTYPES if d2 != dt]
        return names
    if filename == "ewise_strided.cu":
        return [strided_binary_name(p, dt) for dt in dtypes for p in _elementwise_primitives()
                if p.scalar < 0 and p.family != "unary"]
    if filename in ("reduce.cu", "reduce_fast.cu"):
        kinds = ("thread", "block") if filename == "reduce.cu" else FAST_REDUCE_KINDS
        name = reduce_name if filename == "reduce.cu" else fast_reduce_name
        names = []
        for dt in dtypes:
            acc = ACC_DTYPE[dt]
            pairs = {(dt, dt), (dt, acc), (acc, dt), (acc, acc)}
            names += [name(kind, op, s, d) for kind in kinds
                      for op in ("sum", "max") for s, d in sorted(pairs)]
        return names
    per_dtype = {
        "matmul.cu": ("matmul_naive", "matmul_tiled"),
        "softmax.cu": ("softmax_rows", "logsumexp_rows"),
        "layernorm.cu": ("layernorm_fwd", "layernorm_bwd_dx", "layernorm_bwd_dwdb",
                     "layernorm_bwd_dwdb_sum"),
        "norm_fast.cu": ("softmax_rows_fast", "logsumexp_rows_fast", "layernorm_fwd_fast"),
        "dropout.cu": ("dropout_fwd", "dropout_bwd"),
        "conv.cu": ("conv_im2col", "conv_col2im", "conv_bias_add"),
        "batchnorm.cu": ("bn_fwd_partials", "bn_fwd_apply", "bn_bwd_partials", "bn_bwd_apply"),
        "multi_tensor.cu": ("multi_tensor_adam", "multi_tensor_sgd"),
    }
    names = [typed_name(k, dt) for dt in dtypes for k in per_dtype[filename]]
    if filename == "dropout.cu":
        names.append("dropout_uniform")
    if filename == "conv.cu":  # column_sum<TIn, TOut>: one pass, or two through TOut = Acc
        names += [pair_name("column_sum", s, d) for dt in dtypes
                  for s, d in sorted({(dt, dt), (dt, ACC_DTYPE[dt]), (ACC_DTYPE[dt], dt)})]
    if filename == "multi_tensor.cu":
        names.append("multi_tensor_adam_count")
    return names


# ---------------------------------------------------------------------- launch shapes
def next_pow2(x: int) -> int:
    """Smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def ewise_launch(n: int, block: int = BLOCK, max_blocks: int = 65536) -> Tuple[int, int]:
    """(grid, block) for a grid-stride loop over n > 0 elements."""
    if n <= 0:
        raise ValueError(f"ewise_launch needs n > 0, got {n}")
    return min(math.ceil(n / block), max_blocks), block


def row_block(cols: int, per_thread: int = 4) -> int:
    """Threads for a block that owns one row of ``cols``: a multiple of 32 in [32, 1024]."""
    return max(32, min(1024, next_pow2(math.ceil(max(cols, 1) / per_thread))))


class ReduceLaunch(TypedDict):
    """``reduce_launch``'s answer (its docstring says what each field means)."""

    kind: str
    block: int
    grid_rows: int
    chunks: int
    chunk: int


def _row_chunks(rows: int, size: int, block: int, num_sms: int) -> int:
    """Blocks per row: 1, or for few long rows enough that about 4 blocks per SM are busy."""
    if rows < 2 * num_sms and size >= 8 * block:
        return min(math.ceil(4 * num_sms / rows), math.ceil(size / (8 * block)), 65535)
    return 1


def reduce_launch(rows: int, size: int, num_sms: int = 132) -> ReduceLaunch:
    """How to reduce ``rows`` rows of ``size`` elements.

    Returns ``kind`` ("thread" or "block"), ``block`` threads, ``grid_rows`` blocks along rows,
    ``chunks`` blocks per row (>1 means a second pass over the partials) and ``chunk`` elements.
    """
    if rows <= 0 or size <= 0:
        raise ValueError(f"reduce_launch needs rows > 0 and size > 0, got {rows}, {size}")
    if size <= 32 and rows >= 32 * num_sms:
        grid, block = ewise_launch(rows)
        return {"kind": "thread", "block": block, "grid_rows": grid, "chunks": 1, "chunk": size}
    block = max(32, min(512, next_pow2(size)))
    chunk = math.ceil(size / _row_chunks(rows, size, block, num_sms))
    chunks = math.ceil(size / chunk)  # drop empty trailing chunks
    return {"kind": "block", "block": block, "grid_rows": min(rows, 65535 * 16),
            "chunks": chunks, "chunk": chunk}


FAST_REDUCE_KINDS = ("rows_warp", "rows_wide", "cols")
WARP_ROW_MAX = 4096  # rows up to this many elements take a warp each (reduce_rows_warp)


class FastReduceLaunch(TypedDict):
    """``fast_reduce_launch``'s answer: ``kind`` (a FAST_REDUCE_KINDS entry), ``grid`` and
    ``block`` of the launch, and for "rows_wide" the ``chunks`` per row (> 1: a second pass
    over the partials) of ``chunk`` elements."""

    kind: str
    grid: Tuple[int, int]
    block: Tuple[int, int]
    chunks: int
    chunk: int


def fast_reduce_launch(outer: int, size: int, inner: int, itemsize: int,
                     num_sms: int = 132) -> FastReduceLaunch:
    """How reduce_fast.cu reduces compact (outer, size, inner) over its middle axis."""
    if outer <= 0 or size <= 0 or inner <= 0:
        raise ValueError(f"fast_reduce_launch needs sizes > 0, got {outer}, {size}, {inner}")
    if inner > 1:
        return {"kind": "cols", "grid": (math.ceil(inner / 32), min(outer, 65535)),
                "block": (32, 8), "chunks": 1, "chunk": size}
    if size <= WARP_ROW_MAX:
        warps = 8  # 256 threads
        return {"kind": "rows_warp", "grid": (min(math.ceil(outer / warps), 65535 * 16), 1),
                "block": (32 * warps, 1), "chunks": 1, "chunk": size}
    block = 512
    chunks = _row_chunks(outer, size, block, num_sms)
    pack = max(1, 16 // itemsize)  # a chunk of whole 16-byte packs keeps each one aligned
    chunk = math.ceil(math.ceil(size / chunks) / pack) * pack
    chunks = math.ceil(size / chunk)
    return {"kind": "rows_wide", "grid": (min(outer, 65535 * 16), chunks), "block": (block, 1),
            "chunks": chunks, "chunk": chunk}


WARP_ROW_BYTES = 4096  # rows up to this many bytes take a warp each in norm_fast.cu


def norm_launch(rows: int, cols: int, itemsize: int) -> Tuple[int, int, int]:
    """(grid, block, group) for norm_fast.cu over ``rows`` rows of ``cols`` elements: ``group``
    threads per row, 32 (a warp per row, 8 rows per block) for short rows, else the block (128
    to 512 threads, about four 16-byte packs each)."""
    if rows <= 0 or cols <= 0:
        raise ValueError(f"norm_launch needs rows > 0 and cols > 0, got {rows}, {cols}")
    if cols * itemsize <= WARP_ROW_BYTES:
        return min(math.ceil(rows / 8), 65535 * 16), 256, 32
    block = max(128, min(512, next_pow2(math.ceil(cols * itemsize / 64))))
    return min(rows, 65535 * 16), block, block


def matmul_launch(batch: int, m: int, p: int, mode: str) -> Tuple[Tuple[int, int, int],
                                                                    Tuple[int, int, int]]:
    """(grid, block) for the naive (16x16 threads) or tiled (256 threads) matmul kernel."""
    if mode == "naive":
        return (math.ceil(p / 16), math.ceil(m / 16), batch), (16, 16, 1)
    if mode == "tiled":
        bm, bn = MATMUL_TILE
        return (math.ceil(p / bn), math.ceil(m / bm), batch), (256, 1, 1)
    raise ValueError(f"unknown matmul kernel {mode!r}; expected 'naive' or 'tiled'")


def view_meta(shape: Tuple[int, ...], strides: Tuple[int, ...], offset: int) -> List[int]:
    """The ``meta`` array the strided kernels read: [ndim, offset, *shape, *strides]."""
    if len(shape) != len(strides):
        raise ValueError(f"shape {shape} and strides {strides} differ in length")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"the CUDA backend supports at most {MAX_DIMS} dimensions, "
                         f"got shape {shape}")
    return [len(shape), int(offset), *map(int, shape), *map(int, strides)]
