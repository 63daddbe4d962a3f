"""The device primitives, declared once: name, parameters, buffers read and written, and the
scalar expression that code generation writes for the elementwise ones.

Every backend implements the required primitives (``ndarray_backend_numpy.py`` is the
reference, ``backend_cuda/ndarray_backend_cuda.py`` the GPU one) and may offer the optional
ones. ``NDArray`` calls them by these names; ``needle.compile`` records them (``access`` says
which buffers a call reads and writes) and fuses the elementwise ones into one
``fused_elementwise`` kernel, whose statements are written from ``expr``. This module is pure
data, so the CUDA backend (below ``backend_ndarray`` in the import order) may read it.

A read is ``(position, view)``: the argument at ``position`` is a buffer read through
``view``: None (the whole buffer, element i for element i), the position of one argument
holding a (shape, strides, offset) triple, or the positions of the three arguments.
"""
import ast
import re
from typing import Dict, NamedTuple, Optional, Tuple, Union

ViewSpec = Union[None, int, Tuple[int, int, int]]


class Primitive(NamedTuple):
    """One device primitive: its signature, what it reads and writes, how it is generated."""

    name: str
    params: Tuple[str, ...]                   # parameter names, in call order
    reads: Tuple[Tuple[int, ViewSpec], ...]   # (argument position, view) of buffers read
    write: int                                # argument position of the buffer written
    partial: bool = False                     # only part of the written buffer changes
    elementwise: bool = False                 # out[i] depends on the inputs' element i only
    expr: Optional[str] = None                # Python-syntax expression over {0}, {1}, ...
    scalar: int = -1                          # position of the scalar argument, if any
    family: str = ""                          # "binary", "compare", "unary" or ""
    required: bool = True                     # every backend implements it
    opaque: bool = False                      # buffers read/written not declared: all may be
    ufunc: str = ""                           # NumPy's (and CuPy's) ufunc, for the families

    @property
    def arity(self) -> int:
        """The number of parameters."""
        return len(self.params)

    @property
    def op(self) -> str:
        """The elementwise op of an ewise_/scalar_ primitive (``add`` for ``scalar_add``)."""
        return self.name.split("_", 1)[1]

    def formula(self) -> str:
        """The expression over the parameter names (``a + val``), for docstrings."""
        return (self.expr or "").format(*self.params)


# The elementwise ops, one row each: name, NumPy's (and CuPy's) ufunc, and the expression in
# Python syntax over the operands {0}, {1}. A row is the whole declaration (minitorch builds
# each backend's map from one scalar function): every backend makes ewise_<name>(a, b, out) and
# scalar_<name>(a, val, out) from it (ewise_<name>(a, out) for one operand) with the ufunc, the
# CUDA functor is the expression in C (kernel_specs.functors) and needle.compile fuses the
# expression. An expression that compares writes bool.
ELEMENTWISE = (
    ("add", "add", "{0} + {1}"), ("sub", "subtract", "{0} - {1}"),
    ("mul", "multiply", "{0} * {1}"), ("div", "true_divide", "{0} / {1}"),
    ("pow", "power", "{0} ** {1}"),
    # np.maximum's semantics (NaN wins, max(-0., 0.) is 0.) written with where()
    ("maximum", "maximum", "where(({0} > {1}) | ({0} != {0}), {0}, {1})"),
    ("eq", "equal", "{0} == {1}"), ("ne", "not_equal", "{0} != {1}"),
    ("lt", "less", "{0} < {1}"), ("le", "less_equal", "{0} <= {1}"),
    ("gt", "greater", "{0} > {1}"), ("ge", "greater_equal", "{0} >= {1}"),
    ("neg", "negative", "-{0}"), ("log", "log", "log({0})"), ("exp", "exp", "exp({0})"),
    ("tanh", "tanh", "tanh({0})"), ("sqrt", "sqrt", "sqrt({0})"), ("abs", "abs", "abs({0})"),
    ("sin", "sin", "sin({0})"), ("cos", "cos", "cos({0})"),
)
_VIEW = ("shape", "strides", "offset")


def _compares(expr: str) -> bool:
    """True when the expression's outermost operation is a comparison (it writes bool)."""
    return isinstance(ast.parse(expr.format("x", "y"), mode="eval").body, ast.Compare)


def elementwise(name: str, ufunc: str, expr: str) -> Tuple[Primitive, ...]:
    """The primitives of one row of ``ELEMENTWISE``: ewise_<name>, and scalar_<name> when
    the expression takes two operands."""
    if "{1}" not in expr:
        return (Primitive(f"ewise_{name}", ("a", "out"), ((0, None),), 1, elementwise=True,
                          expr=expr, family="unary", ufunc=ufunc),)
    family = "compare" if _compares(expr) else "binary"
    return (Primitive(f"ewise_{name}", ("a", "b", "out"), ((0, None), (1, None)), 2,
                      elementwise=True, expr=expr, family=family, ufunc=ufunc),
            Primitive(f"scalar_{name}", ("a", "val", "out"), ((0, None),), 2,
                      elementwise=True, expr=expr, scalar=1, family=family, ufunc=ufunc))


EWISE_BINARY = tuple(name for name, _, expr in ELEMENTWISE if "{1}" in expr)
EWISE_UNARY = tuple(name for name, _, expr in ELEMENTWISE if "{1}" not in expr)
COMPARISONS = frozenset(n for n, _, expr in ELEMENTWISE if "{1}" in expr and _compares(expr))
# The functions the expressions call (each backend's code generator maps them to its own)
FUNCTIONS = tuple(dict.fromkeys(re.findall(r"([a-z]\w*)\(", " ".join(
    expr for _, _, expr in ELEMENTWISE))))

_BASE = (
    Primitive("fill", ("out", "val"), (), 0, elementwise=True, expr="{0}", scalar=1),
    Primitive("compact", ("a", "out") + _VIEW, ((0, (2, 3, 4)),), 1, elementwise=True,
              expr="{0}"),
    Primitive("ewise_setitem", ("a", "out") + _VIEW, ((0, None), (1, None)), 1, partial=True),
    Primitive("scalar_setitem", ("size", "val", "out") + _VIEW, ((2, None),), 2,
              partial=True, scalar=1),
    # astype is fused only from bool to a float type: 1 and 0 of the compute dtype
    Primitive("ewise_astype", ("a", "out"), ((0, None),), 1, elementwise=True,
              expr="where({0}, {one}, {zero})"),
    Primitive("ewise_where", ("cond", "a", "b", "out"), ((0, None), (1, None), (2, None)), 3,
              elementwise=True, expr="where({0}, {1}, {2})"),
    Primitive("matmul", ("a", "b", "out", "batch", "m", "n", "p", "trans_a", "trans_b"),
              ((0, None), (1, None)), 2),
    Primitive("reduce_sum", ("a", "out", "reduce_size", "inner_size"), ((0, None),), 1),
    Primitive("reduce_max", ("a", "out", "reduce_size", "inner_size"), ((0, None),), 1),
    Primitive("take_rows", ("a", "idx", "out", "row_size"), ((0, None), (1, None)), 2),
    Primitive("scatter_add_rows", ("src", "idx", "out", "row_size"),
              ((0, None), (1, None), (2, None)), 2, partial=True),
    Primitive("from_numpy", ("a", "out"), (), 1),
    Primitive("to_numpy", ("a",) + _VIEW, ((0, (1, 2, 3)),), -1),
)

_OPTIONAL = (
    Primitive("ewise_strided", ("name", "a", "a_view", "b", "b_view", "out"),
              ((1, 2), (3, 4)), 5, elementwise=True, required=False),
    Primitive("matmul_tiled", ("a", "b", "out", "m", "n", "p"), ((0, None), (1, None)), 2,
              required=False),
    # needle.compile's kernels: ``expr`` over views (fused_elementwise_cpu.py); its buffers
    # sit inside ``inputs``, so a recording treats it as reading and writing everything
    Primitive("fused_elementwise", ("expr", "inputs", "out", "shape", "reduce"), (), 2,
              partial=True, required=False, opaque=True),
)


def _fused_op(name: str, params: Tuple[str, ...]) -> Primitive:
    """A fused operation's kernel (fused_ops.py); it writes several of its buffers."""
    return Primitive(name, params, (), -1, partial=True, required=False, opaque=True)


# Whole operations a device may run as one kernel (fused_ops.py chooses them or the
# composition of the primitives above); the parameters are flat compact buffers and scalars.
FUSED_OPS = (
    _fused_op("softmax_rows", ("a", "out", "rows", "cols")),
    _fused_op("logsumexp_rows", ("a", "out", "rows", "cols")),
    _fused_op("layer_norm_fwd", ("x", "w", "b", "y", "mean", "rstd", "rows", "cols", "eps")),
    _fused_op("layer_norm_bwd", ("dy", "x", "w", "mean", "rstd", "dx", "dw", "db", "rows",
                                 "cols")),
    _fused_op("dropout", ("x", "y", "mask", "prob", "seed", "offset")),
    _fused_op("dropout_backward", ("dy", "mask", "dx", "prob")),
)
# Convolution and batch norm as a GPU does them (fused_ops.conv2d, fused_ops.batch_norm): in the
# table, so that needle.compile records them; a device without them composes the course's ops
CONV_OPS = (
    _fused_op("conv_im2col", ("x", "cols", "view", "kernel_hw", "stride", "padding")),
    _fused_op("conv_col2im", ("dcols", "dx", "view", "out_hw", "kernel_hw", "stride",
                              "padding")),
    _fused_op("conv_bias_add", ("y", "bias", "rows", "cols")),
    _fused_op("column_sum", ("a", "out", "rows", "cols")),
    _fused_op("batch_norm_fwd", ("x", "x_view", "w", "b", "running_mean", "running_var", "y",
                                 "y_view", "new_mean", "new_var", "stats", "momentum", "eps")),
    _fused_op("batch_norm_bwd", ("dy", "dy_view", "x", "x_view", "w", "stats", "dx",
                                 "dx_view", "dw", "db")),
)
# Primitives a recording cannot replay (their buffers come in lists): a function calling one
# runs eagerly under needle.compile (an optimizer step belongs outside the compiled function)
UNRECORDED = ("multi_tensor_adam", "multi_tensor_sgd")

TABLE: Dict[str, Primitive] = {p.name: p for p in (
    *_BASE, *(q for row in ELEMENTWISE for q in elementwise(*row)), *_OPTIONAL, *FUSED_OPS,
    *CONV_OPS)}
# Required primitives outside the ewise_/scalar_ families, and the optional ones.
PRIMITIVES = tuple(p.name for p in _BASE)
OPTIONAL_PRIMITIVES = tuple(p.name for p in _OPTIONAL) + UNRECORDED
REQUIRED = tuple(n for n, p in TABLE.items() if p.required)
lookup = TABLE.get  # lookup(name): the declaration of primitive ``name``, or None
