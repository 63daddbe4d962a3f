"""Step 2 of ``needle.compile``: can a recording be replayed, and where do its inputs live?
Arrays the function computed may stay referenced only by its results or as object state."""
import gc
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..autograd import Tensor
from ..backend_ndarray import NDArray
from .capture import Trace, alive_elsewhere
from .results import meta

Role = Tuple[int, tuple]  # (buffer index, ("arg", k) | ("leaf", j) | ("attr", (obj, name)))


def attribute_owners(arr: Any) -> Iterator[Tuple[Any, str, NDArray]]:
    """(object, attribute, NDArray) for each ``object.attribute`` Tensor whose data is ``arr``."""
    for nd in gc.get_referrers(arr):
        if type(nd) is not NDArray or nd._handle is not arr:
            continue
        for t in gc.get_referrers(nd):
            if isinstance(t, Tensor) and t.cached_data is nd:
                for obj, k in _holders(t):
                    yield obj, k, nd


def _holders(t: Tensor) -> Iterator[Tuple[Any, str]]:
    """(object, attribute name) of each instance attribute that is ``t``."""
    for d in gc.get_referrers(t):
        # Python 3.11+ may keep attributes inline: the referrer is then the object
        objs = [d] if type(d) is not dict else [
            o for o in gc.get_referrers(d) if getattr(o, "__dict__", None) is d]
        for obj in objs:
            attrs = getattr(obj, "__dict__", None)
            if type(attrs) is not dict or isinstance(obj, type):
                continue
            yield from ((obj, k) for k, v in list(attrs.items()) if v is t)


def check_arrays(trace: Trace, keep: Sequence[Optional[int]], others: Sequence[Trace] = ()
                 ) -> Tuple[Optional[str], list]:
    """(problem or None, state): ``state`` lists the (object, attribute, NDArray) the function
    stored on objects, for a replay to store again; any other array still referenced is a
    problem."""
    kept = [k for k in keep if k is not None]
    escaped = alive_elsewhere(trace, kept, others)
    if escaped:
        gc.collect()
        escaped = alive_elsewhere(trace, kept, others)
    states: list = []
    for b in escaped:
        owners = list(attribute_owners(trace.arrays[b]))
        if not owners:
            return (f"an array computed inside the function (%{b}) is still referenced "
                    f"after it returned, not as an object's tensor attribute (a cache? "
                    f"a list?), so a replay could not update it"), []
        states += owners
    return None, states


def owners(args: tuple, leaves: List[Tensor]) -> Dict[int, tuple]:
    """id(buffer) -> ("arg", k) or ("leaf", j) for the arguments' and leaves' buffers."""
    out: Dict[int, tuple] = {}
    for j, leaf in reversed(list(enumerate(leaves))):
        out[id(leaf.realize_cached_data()._handle)] = ("leaf", j)
    for k, a in reversed(list(enumerate(args))):
        if isinstance(a, Tensor):
            out[id(a.realize_cached_data()._handle)] = ("arg", k)
    return out


def roles(trace: Trace, args: tuple, leaves: List[Tensor], pre: Dict[int, tuple]
          ) -> List[Role]:
    """For each buffer read from outside the trace: (buffer, where it comes from)."""
    known = dict(pre)
    known.update(owners(args, leaves))
    out = []
    for b, arr in enumerate(trace.arrays):
        if trace.internal[b]:
            continue
        if id(arr) in known:
            out.append((b, known[id(arr)]))
            continue
        for obj, name, _ in attribute_owners(arr):
            out.append((b, ("attr", (obj, name))))
            break
    return out


def attr_meta(rs: List[Role]) -> List[tuple]:
    """((object, name), meta) of each attribute tensor read: part of the guard."""
    return [(r[1], meta(getattr(*r[1]).realize_cached_data())) for _, r in rs if r[0] == "attr"]
