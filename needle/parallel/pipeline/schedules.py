"""Pipeline schedules as pure functions: for each stage, the ordered list of its actions.

An action is ``("F", microbatch)`` / ``("B", microbatch)``, with a third item, the chunk, for the
interleaved schedule (stage s holds virtual stages s, s+p, ..., s+(v-1)p). Sends and receives
are implied by the dependencies: F(m) on virtual stage k needs F(m) of k-1, B(m) needs B(m) of
k+1 and its own F(m).

* ``gpipe`` (Huang et al., arXiv:1811.06965, Fig. 2c): all forwards, then all backwards.
* ``one_f_one_b`` (Narayanan et al., arXiv:2006.09503; arXiv:2104.04473, sec. 2.2.1): p-s-1
  warm-up forwards, then alternate; at most p-s microbatches in flight, same bubble as GPipe.
* ``interleaved_1f1b`` (arXiv:2104.04473, sec. 2.2.2): v chunks per stage cut the bubble to
  (p-1)/(v*m+p-1) at v times the messages.
"""
from typing import Callable, Dict, List, Tuple

__all__ = ["gpipe", "one_f_one_b", "interleaved_1f1b", "Action", "SCHEDULES"]

Action = Tuple  # ("F" | "B", microbatch) or ("F" | "B", microbatch, chunk)


def _check(num_stages: int, num_microbatches: int) -> None:
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(f"a pipeline needs >= 1 stage and >= 1 microbatch, got "
                         f"num_stages={num_stages}, num_microbatches={num_microbatches}")


def gpipe(num_stages: int, num_microbatches: int) -> List[List[Action]]:
    """All forwards then all backwards, on every stage (GPipe)."""
    _check(num_stages, num_microbatches)
    m = num_microbatches
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)]
            for _ in range(num_stages)]


def one_f_one_b(num_stages: int, num_microbatches: int) -> List[List[Action]]:
    """Warm-up forwards, then one forward / one backward, then the remaining backwards."""
    _check(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    return [_warmup_then_alternate(min(p - s - 1, m), m, lambda i: ("F", i), lambda i: ("B", i))
            for s in range(p)]


def _warmup_then_alternate(warmup: int, total: int, fwd: Callable[[int], Action],
                           bwd: Callable[[int], Action]) -> List[Action]:
    """``warmup`` forwards, then one forward / one backward, then the remaining backwards."""
    acts = [fwd(k) for k in range(warmup)]
    for i in range(total - warmup):
        acts += [fwd(warmup + i), bwd(i)]
    return acts + [bwd(k) for k in range(total - warmup, total)]


def interleaved_1f1b(num_stages: int, num_microbatches: int,
                     chunks_per_stage: int) -> List[List[Action]]:
    """Megatron's interleaved 1F1B: each stage alternates over its v model chunks.

    Microbatches go through the chunks in groups of p (Megatron's ``get_model_chunk_id``): the
    k-th forward of a stage is chunk (k // p) % v on microbatch (k // (p v)) p + k % p; the k-th
    backward walks the chunks in reverse. Needs m to be a multiple of p, as Megatron does.
    """
    _check(num_stages, num_microbatches)
    p, m, v = num_stages, num_microbatches, chunks_per_stage
    if v < 1:
        raise ValueError(f"chunks_per_stage must be >= 1, got {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the number of microbatches ({m}) to be a "
                         f"multiple of the number of stages ({p})")
    total = m * v

    def fwd(k: int) -> Action:
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> Action:
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    return [_warmup_then_alternate(min((p - s - 1) * 2 + (v - 1) * p, total), total, fwd, bwd)
            for s in range(p)]


SCHEDULES: Dict[str, Callable[..., List[List[Action]]]] = {
    "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b}
