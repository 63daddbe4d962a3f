"""The statement language of needle.compile's fused kernels (``backend_ndarray/kernel_expr.py``)
and the primitive table's elementwise expressions as CUDA C: pure text, no CuPy (kernel_specs
writes ewise.cu's functors with it; fused_elementwise_cuda.py its ElementwiseKernels)."""
import ast
from typing import List, cast

from ..backend_ndarray import primitives as P

_FUNCS = {f: {"abs": "fabs"}.get(f, f) for f in P.FUNCTIONS if f != "where"}
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitOr: "|",
        ast.BitAnd: "&"}
_CMPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
         ast.GtE: ">="}


def to_c(node: ast.AST) -> str:
    """CUDA C for one expression of the statement language."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        a, b = to_c(node.left), to_c(node.right)
        if isinstance(node.op, ast.Pow):
            return f"pow({a}, {b})"
        return f"({a} {_OPS[type(node.op)]} {b})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"(-{to_c(node.operand)})"
    if isinstance(node, ast.Compare):
        return f"({to_c(node.left)} {_CMPS[type(node.ops[0])]} {to_c(node.comparators[0])})"
    if isinstance(node, ast.Call):
        args = [to_c(a) for a in node.args]
        func = cast(ast.Name, node.func).id  # the expressions call names only
        if func == "where":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        return f"{_FUNCS[func]}({args[0]})"
    raise ValueError(f"fused_elementwise: unsupported expression {ast.dump(node)}")


def body_lines(expr: str) -> List[str]:
    """The statements as CUDA C lines (temporaries as ``auto``; ``out`` assigned last)."""
    lines = []
    for stmt in ast.parse(expr.replace("; ", "\n")).body:
        assign = cast(ast.Assign, stmt)  # every statement is ``name = expression``
        name = cast(ast.Name, assign.targets[0]).id
        rhs = to_c(assign.value)
        lines.append(f"out = {rhs};" if name == "out" else f"auto {name} = {rhs};")
    return lines
