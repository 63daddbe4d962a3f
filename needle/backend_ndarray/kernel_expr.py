"""The statement language of the ``fused_elementwise`` primitive: SSA statements over ``x0..xk``
and ``c0..cm``, the last assigning ``out``, joined into one string a kernel cache keys on."""
from typing import Dict, Sequence, Tuple

Stmt = Tuple[str, str]  # (name assigned, expression in Python syntax)


def join(stmts: Sequence[Stmt]) -> str:
    """The primitive's ``expr`` string of ``stmts``."""
    return "; ".join(f"{lhs} = {rhs}" for lhs, rhs in stmts)


def rename(expr: str, names: Dict[str, str]) -> str:
    """``expr`` with each name token (``x0``, ``t3``, ...) found in ``names`` replaced."""
    out, tok = [], ""
    for ch in expr + " ":
        if ch.isalnum() or ch == "_":
            tok += ch
            continue
        if tok:
            out.append(names.get(tok, tok))
            tok = ""
        out.append(ch)
    return "".join(out)[:-1]
