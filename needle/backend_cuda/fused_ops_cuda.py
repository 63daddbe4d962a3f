"""Fused GPU kernels as optional backend primitives on compact flat buffers;
``backend_ndarray.fused_ops`` falls back to composed ops where a device lacks them."""
import math
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from . import _runtime as rt
from . import kernel_specs as K

__all__ = ["softmax_rows", "logsumexp_rows", "layer_norm_fwd", "layer_norm_bwd",
           "dropout", "dropout_backward", "multi_tensor_adam", "multi_tensor_sgd"]


def _launch_rows(filename: str, kernel: str, x: Any, rows: int, cols: int, args: tuple) -> None:
    if rows == 0 or cols == 0:
        return
    dt, idx = rt.DTYPE_NAME[x.dtype], x.device_index
    k = rt.kernel(filename, K.typed_name(kernel, dt), dt, idx)
    rt.launch(k, (min(rows, 65535 * 16),), (K.row_block(cols),), args, idx)


def _launch_flat(filename: str, kernel: str, x: Any, n: int, args: tuple) -> None:
    if n == 0:
        return
    grid, block = K.ewise_launch(n)
    dt, idx = rt.DTYPE_NAME[x.dtype], x.device_index
    rt.launch(rt.kernel(filename, K.typed_name(kernel, dt), dt, idx), (grid,), (block,), args,
              idx)


def _launch_fast(kernel: str, x: Any, rows: int, cols: int, args: tuple) -> None:
    """norm_fast.cu's ``kernel`` over ``rows`` rows of ``cols``; its ``group`` is appended."""
    if rows == 0 or cols == 0:
        return
    dt, idx = rt.DTYPE_NAME[x.dtype], x.device_index
    grid, block, group = K.norm_launch(rows, cols, x.dtype.itemsize)
    k = rt.kernel("norm_fast.cu", K.typed_name(kernel, dt), dt, idx)
    rt.launch(k, (grid,), (block,), args + (np.int32(group),), idx)


def _rows_kernel(course_file: str, kernel: str, x: Any, rows: int, cols: int,
                 args: tuple) -> None:
    """``kernel`` of the course's ``course_file``, or its ``_fast`` twin in norm_fast.cu when
    set_reduce_kernel is "fast"."""
    if rt.REDUCE_MODE[0] == "fast":
        _launch_fast(kernel + "_fast", x, rows, cols, args)
    else:
        _launch_rows(course_file, kernel, x, rows, cols, args)


def softmax_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out = softmax of each of the ``rows`` rows of length ``cols`` (online normalizer)."""
    _rows_kernel("softmax.cu", "softmax_rows", a, rows, cols,
                 (a.array, out.array, np.int64(rows), np.int64(cols)))


def logsumexp_rows(a: Any, out: Any, rows: int, cols: int) -> None:
    """out[r] = log(sum(exp(row r))) for ``rows`` rows of length ``cols`` > 0."""
    _rows_kernel("softmax.cu", "logsumexp_rows", a, rows, cols,
                 (a.array, out.array, np.int64(rows), np.int64(cols)))


def layer_norm_fwd(x: Any, w: Any, b: Any, y: Any, mean: Any, rstd: Any, rows: int, cols: int,
                   eps: float) -> None:
    """y, mean, rstd of layer norm over rows of length ``cols``; mean, rstd float32 (float64)."""
    _rows_kernel("layernorm.cu", "layernorm_fwd", x, rows, cols,
                 (x.array, w.array, b.array, y.array, mean.array, rstd.array, np.int64(rows),
                  np.int64(cols), rt.acc_arg(eps, x)))


def layer_norm_bwd(dy: Any, x: Any, w: Any, mean: Any, rstd: Any, dx: Any, dw: Any, db: Any,
                   rows: int, cols: int) -> None:
    """dx (x's dtype) and dw, db (the accumulation dtype, like mean) of layer norm."""
    _launch_rows("layernorm.cu", "layernorm_bwd_dx", x, rows, cols,
                 (dy.array, x.array, w.array, mean.array, rstd.array, dx.array,
                  np.int64(rows), np.int64(cols)))
    idx = x.device_index
    with rt.device(idx):
        if rows == 0 or cols == 0:
            dw.array.fill(0)
            db.array.fill(0)
            return
        rows_per = max(32, math.ceil(rows / 256))  # about 256 row chunks: partials stay small
        chunks = math.ceil(rows / rows_per)
        # dw's partials, then db's, in a buffer of needle's pool (an Array like x's)
        part_buf = type(x)(2 * chunks * cols, dw.dtype, idx)
        part = part_buf.array
        dt = rt.DTYPE_NAME[x.dtype]
        k = rt.kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb", dt), dt, idx)
        rt.launch(k, (math.ceil(cols / 256), chunks), (256,),
                  (dy.array, x.array, mean.array, rstd.array, part, part[chunks * cols:],
                   np.int64(rows), np.int64(cols), np.int64(rows_per)), idx)
        grid, block = K.ewise_launch(cols)
        k = rt.kernel("layernorm.cu", K.typed_name("layernorm_bwd_dwdb_sum", dt), dt, idx)
        rt.launch(k, (grid,), (block,), (part, part[chunks * cols:], dw.array, db.array,
                                         np.int64(chunks), np.int64(cols)), idx)


def dropout(x: Any, y: Any, mask: Any, prob: float, seed: int, offset: int) -> None:
    """y = x * keep / (1 - prob) and the bool ``mask`` keep, replayable from (seed, offset)."""
    n = x.size
    _launch_flat("dropout.cu", "dropout_fwd", x, n,
                 (x.array, y.array, mask.array, np.int64(n), np.float32(prob),
                  rt.acc_arg(1.0 / (1.0 - prob), x), np.uint64(seed % 2 ** 64),
                  np.uint64(offset % 2 ** 64)))


def dropout_backward(dy: Any, mask: Any, dx: Any, prob: float) -> None:
    """dx = dy * mask / (1 - prob)."""
    n = dy.size
    _launch_flat("dropout.cu", "dropout_bwd", dy, n,
                 (dy.array, mask.array, dx.array, np.int64(n), rt.acc_arg(1.0 / (1.0 - prob), dy)))


# ---------------------------------------------------------------------- multi-tensor steps
MT_CHUNK = 65536  # elements of one tensor per block (PyTorch's multi_tensor_apply chunk)
MT_BLOCK = 256


def _mt_table(ps: Sequence[Any], gs: Sequence[Any], ss: Sequence[Any], ts: Sequence[Any],
              slots: Sequence[int], cache: Dict[str, Any]) -> Tuple[Any, int]:
    """multi_tensor.cu's table for these tensors (None in ``ts``: no second state buffer) and
    its number of blocks. Uploaded (one host-to-device copy, into the previous table's buffer
    when it has the size) only when an address, size or slot differs from the cached one's."""
    words: list = []  # a loop, not a generator: this runs every step
    for p, g, s, t, slot in zip(ps, gs, ss, ts, slots):
        words += (p.array.data.ptr, g.array.data.ptr, 0 if s is None else s.array.data.ptr,
                  0 if t is None else t.array.data.ptr, p.size, slot)
    key = tuple(words)
    if cache.get("key") == key:
        return cache["table"], cache["blocks"]
    if rt.CAPTURE_KEEP[0] is not None:
        raise RuntimeError("a multi-tensor optimizer step captured into a CUDA graph: its "
                           "parameters', gradients' or state buffers are not the last step's, "
                           "so their pointer table would be uploaded during the capture; run "
                           "one step eagerly on these buffers first (with needle.compile's "
                           "graph mode, after its first graph replay)")
    rows = np.array(key, dtype=np.int64).reshape(len(ps), 6)
    first = np.zeros(len(ps) + 1, dtype=np.int64)
    np.cumsum(-(-rows[:, 4] // MT_CHUNK), out=first[1:])
    host = np.concatenate([rows.reshape(-1), first])
    table = cache.get("table")
    with rt.device(ps[0].device_index):
        if table is not None and table.size == host.size:
            table.set(host)
        else:
            table = rt.cp.asarray(host)
    cache.update(key=key, table=table, blocks=int(first[-1]))
    return table, cache["blocks"]


def _mt_launch(kernel: str, dtype: str, idx: int, grid: int, block: int, args: tuple) -> None:
    name = kernel if kernel.endswith("_count") else K.typed_name(kernel, dtype)
    rt.launch(rt.kernel("multi_tensor.cu", name, dtype, idx), (grid,), (block,), args, idx)


def multi_tensor_adam(ps: Sequence[Any], gs: Sequence[Any], ms: Sequence[Any],
                      vs: Sequence[Any], slots: Sequence[int], steps: Any, hyper: Any,
                      cache: Dict[str, Any], decoupled: bool) -> None:
    """One Adam/AdamW step in place on every ``ps[k]`` (one dtype; gradient ``gs[k]`` of that
    dtype, state ``ms[k]``, ``vs[k]`` in the accumulator dtype), all compact: two launches.
    ``steps`` (int64) counts each tensor's steps at its slot on the device (``steps[slots[k]]``
    += 1 here), ``hyper`` holds [lr, b1, 1 - b1, b2, 1 - b2, eps, wd] as float64; ``cache``
    keeps the pointer table and the bias corrections between calls. The emulator cannot bound
    accesses through a device table: the table's address goes as a bare int (unchecked)."""
    if not ps:
        return
    table, blocks = _mt_table(ps, gs, ms, vs, slots, cache)
    dt, idx, nt = ps[0].dtype.name, ps[0].device_index, len(ps)
    bc = cache.get("bc")
    if bc is None or bc.size != 2 * steps.size:
        with rt.device(idx):
            bc = cache["bc"] = rt.cp.empty(2 * steps.size, dtype=np.float64)
    rt.keep_for_capture(table, bc)
    addr = np.uint64(table.data.ptr)
    grid, block = K.ewise_launch(nt)
    _mt_launch("multi_tensor_adam_count", dt, idx, grid, block,
               (addr, np.int32(nt), steps.array, hyper.array, bc))
    steps.known_range = None  # written on the device
    if blocks:
        _mt_launch("multi_tensor_adam", dt, idx, blocks, MT_BLOCK,
                   (addr, np.int32(nt), np.int64(MT_CHUNK), hyper.array, bc,
                    np.int32(bool(decoupled))))


def multi_tensor_sgd(ps: Sequence[Any], gs: Sequence[Any], us: Sequence[Any], hyper: Any,
                     cache: Dict[str, Any]) -> None:
    """One SGD step (the course's momentum and L2 decay) in place on every ``ps[k]`` (one
    dtype; gradient ``gs[k]`` of that dtype, momentum ``us[k]`` in the accumulator dtype, None
    without momentum), all compact: one launch. ``hyper`` holds [lr, momentum, 1 - momentum,
    weight_decay] as float64; ``cache`` keeps the pointer table (as multi_tensor_adam)."""
    if not ps:
        return
    table, blocks = _mt_table(ps, gs, us, [None] * len(ps), [0] * len(ps), cache)
    rt.keep_for_capture(table)
    if blocks:
        _mt_launch("multi_tensor_sgd", ps[0].dtype.name, ps[0].device_index, blocks, MT_BLOCK,
                   (np.uint64(table.data.ptr), np.int32(len(ps)), np.int64(MT_CHUNK),
                    hyper.array))
