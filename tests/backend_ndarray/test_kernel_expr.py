"""The statement language of ``fused_elementwise``: statements as tuples, joined and split."""
from needle.backend_ndarray.kernel_expr import join, rename


def split(expr: str) -> list:
    """The statements of an ``expr`` string, as (name, expression) tuples."""
    return [tuple(s.split(" = ", 1)) for s in expr.split("; ")]


def test_join_and_split_are_inverse():
    stmts = [("t0", "x0 - x1"), ("t1", "exp(t0)"), ("out", "t1 * c0")]
    expr = join(stmts)
    assert expr == "t0 = x0 - x1; t1 = exp(t0); out = t1 * c0"
    assert split(expr) == stmts


def test_rename_replaces_whole_names_only():
    # x1 must not match inside x10, nor t1 inside exp(t10)
    got = rename("x1 + x10 * exp(t1) - t10", {"x1": "x4", "t1": "(t0 + c0)"})
    assert got == "x4 + x10 * exp((t0 + c0)) - t10"
    assert rename("where(x0, c0, c1)", {}) == "where(x0, c0, c1)"
