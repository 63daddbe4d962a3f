"""Collectives as pure functions over a list of per-rank arrays: the exact references.

Each function takes ``xs``, a Python list whose entry ``r`` is the array held by rank ``r``, and
returns the list of what every rank holds afterwards.  Nothing here talks to MPI: the message
schedule is simulated step by step, in the same order and with the same arithmetic as the MPI
versions in ``ring.py`` / ``latency_bound.py``, so those are tested against these *exactly*
(bit for bit, floating point included), and these are tested against plain numpy.

Ring algorithms follow P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009: the array is cut into ``p``
segments; in ``p - 1`` steps every rank sends one segment to its right neighbour and reduces the
segment arriving from its left one (reduce-scatter), then ``p - 1`` more steps circulate the
finished segments (allgather).  Each rank sends ``2 (p - 1) / p * N`` bytes in total, which is
optimal.  Recursive doubling and binomial trees follow R. Thakur, R. Rabenseifner and W. Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005.
"""
from typing import List

import numpy as np

Array = np.ndarray

# Every reduction is elementwise and commutative; "avg" is "sum" followed by a division by p.
UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def chunk_bounds(n: int, p: int) -> List[int]:
    """Offsets of ``p`` near-equal chunks of ``n`` items, the first ``n % p`` one item longer."""
    q, extra = divmod(n, p)
    return [i * q + min(i, extra) for i in range(p + 1)]


def finish_avg(x: Array, p: int) -> Array:
    """Divide a sum by ``p`` in place: true division for floats, floor division for integers."""
    if x.dtype == np.bool_:
        raise ValueError("op='avg' is not defined for bool arrays")
    if np.issubdtype(x.dtype, np.integer):
        return np.floor_divide(x, p, out=x)
    return np.divide(x, x.dtype.type(p), out=x)


def ring_reduce_scatter(xs: List[Array], op: str = "sum") -> List[Array]:
    """Ring reduce-scatter: rank r ends with chunk r (of p near-equal axis-0 chunks)."""
    p, shape = len(xs), np.shape(xs[0])
    row = int(np.prod(shape[1:], dtype=np.int64))
    rows = chunk_bounds(shape[0], p)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    own = reduce_scatter_segments(flat, [k * row for k in rows], op, shift=0)
    return [o.reshape((rows[r + 1] - rows[r],) + shape[1:]) for r, o in enumerate(own)]


def reduce_scatter_segments(flat: List[Array], b: List[int], op: str, shift: int) -> List[Array]:
    """The ring's reduce phase on flat arrays cut at offsets ``b``: rank r ends with the
    reduction of segment ``(r + shift) % p``."""
    p, ufunc = len(flat), UFUNCS[op]

    def seg(a: Array, i: int) -> Array:
        return a[b[i % p]:b[i % p + 1]]

    acc = [np.empty_like(f) for f in flat]  # what each rank has accumulated so far
    ### BEGIN YOUR SOLUTION (collectives.reference)
    for s in range(p - 1):
        # Snapshot what every rank sends this step before anyone reduces (messages cross).
        sent = [seg(flat[r] if s == 0 else acc[r], r - s - 1 + shift).copy() for r in range(p)]
        for r in range(p):
            i = r - s - 2 + shift  # the segment arriving from the left neighbour
            ufunc(seg(flat[r], i), sent[(r - 1) % p], out=seg(acc[r], i))
    ### END YOUR SOLUTION
    own = [seg(flat[r] if p == 1 else acc[r], r + shift).copy() for r in range(p)]
    if op == "avg":
        own = [finish_avg(o, p) for o in own]
    return own


def recursive_halving_reduce_scatter(xs: List[Array], op: str = "sum") -> List[Array]:
    """Recursive halving reduce-scatter (Thakur et al. 2005, p a power of two): at distance
    d = p/2, ..., 1 rank r reduces the half of its segments that holds segment r with the same
    half from rank ``r XOR d`` (its own values first); rank r ends with chunk r."""
    p, shape, ufunc = len(xs), np.shape(xs[0]), UFUNCS[op]
    row = int(np.prod(shape[1:], dtype=np.int64))
    rows = chunk_bounds(shape[0], p)
    b = [k * row for k in rows]
    acc = [np.ascontiguousarray(x).reshape(-1).copy() for x in xs]
    d = p // 2
    while d >= 1:
        before = [a.copy() for a in acc]  # messages cross: what each rank held
        for r in range(p):
            lo = (r & -(2 * d)) + (d if r & d else 0)  # first segment of the half r keeps
            sl = slice(b[lo], b[lo + d])
            ufunc(before[r][sl], before[r ^ d][sl], out=acc[r][sl])
        d //= 2
    own = [acc[r][b[r]:b[r + 1]].reshape((rows[r + 1] - rows[r],) + shape[1:]) for r in range(p)]
    return [finish_avg(o, p) for o in own] if op == "avg" else own


def ring_allgather(xs: List[Array]) -> List[Array]:
    """Ring allgather: every rank ends with the rank-order concatenation of all ``xs``."""
    p = len(xs)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    n = flat[0].size
    outs = [np.empty(p * n, dtype=flat[0].dtype) for _ in range(p)]
    for r in range(p):
        outs[r][r * n:(r + 1) * n] = flat[r]
    ### BEGIN YOUR SOLUTION (collectives.reference)
    for s in range(p - 1):
        sent = [outs[r][((r - s) % p) * n:((r - s) % p + 1) * n].copy() for r in range(p)]
        for r in range(p):
            i = (r - s - 1) % p  # segment that the left neighbour forwards
            outs[r][i * n:(i + 1) * n] = sent[(r - 1) % p]
    ### END YOUR SOLUTION
    return outs


def ring_allreduce(xs: List[Array], op: str = "sum") -> List[Array]:
    """Ring allreduce = ring reduce-scatter followed by ring allgather (Patarasuk & Yuan 2009)."""
    p, shape = len(xs), np.shape(xs[0])
    flat = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    parts = reduce_scatter_segments(flat, chunk_bounds(flat[0].size, p), op, shift=1)
    in_order = [parts[(i - 1) % p] for i in range(p)]  # segment i lives on rank i - 1
    full = np.concatenate(in_order) if p > 0 else np.empty(0)
    # Assembling the segments is exactly what the allgather circulates; data moves, never changes.
    return [full.reshape(shape).copy() for _ in range(p)]


def recursive_doubling_allreduce(xs: List[Array], op: str = "sum") -> List[Array]:
    """Recursive doubling allreduce (Thakur et al. 2005, with the non-power-of-two fold)."""
    p, ufunc = len(xs), UFUNCS[op]
    vals: List[Array] = [np.array(x, copy=True) for x in xs]
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    for r in range(1, 2 * rem, 2):  # odd ranks absorb their even neighbour
        vals[r] = ufunc(vals[r], vals[r - 1])
    active = [2 * i + 1 if i < rem else i + rem for i in range(p2)]  # new rank -> rank
    ### BEGIN YOUR SOLUTION (collectives.reference)
    mask = 1
    while mask < p2:
        vals_before = [vals[r] for r in active]
        for i, r in enumerate(active):
            vals[r] = ufunc(vals_before[i], vals_before[i ^ mask])
        mask <<= 1
    ### END YOUR SOLUTION
    for r in range(0, 2 * rem, 2):
        vals[r] = vals[r + 1].copy()
    if op == "avg":
        vals = [finish_avg(v, p) for v in vals]
    return vals


def binomial_reduce(xs: List[Array], root: int = 0, op: str = "sum") -> Array:
    """Binomial-tree reduce to ``root``: at step k, virtual rank v receives from v + 2^k."""
    p, ufunc = len(xs), UFUNCS[op]
    acc = [np.array(xs[(v + root) % p], copy=True) for v in range(p)]  # by virtual rank v
    mask = 1
    while mask < p:
        for v in range(0, p, 2 * mask):
            if v + mask < p:
                acc[v] = ufunc(acc[v], acc[v + mask])
        mask <<= 1
    return finish_avg(acc[0], p) if op == "avg" else acc[0]


def pairwise_alltoall(xs: List[Array]) -> List[Array]:
    """Alltoall: rank r receives chunk r (axis 0) of every rank, concatenated in rank order."""
    p = len(xs)
    return [np.concatenate([np.array_split(np.asarray(x), p, axis=0)[r] for x in xs], axis=0)
            for r in range(p)]
