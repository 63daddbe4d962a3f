"""Gradient accumulation: k micro-batches, one step, the full batch's gradient (each loss
weighted b_i / B). ``backward`` overwrites ``.grad`` (course semantics): the sum is kept aside."""
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

from ..autograd import Tensor, no_grad
from ..optim.optimizer import unique_by_identity

__all__ = ["accumulate_gradients", "split_batch"]


def near_equal_bounds(n: int, parts: int) -> List[Tuple[int, int]]:
    """[start, end) of ``parts`` consecutive pieces of ``range(n)``, sizes differing by <= 1."""
    base, extra = divmod(n, parts)
    starts = [i * base + min(i, extra) for i in range(parts + 1)]  # the first ``extra`` longer
    return list(zip(starts, starts[1:]))


def split_batch(batch: Sequence[Tensor], k: int) -> List[List[Tensor]]:
    """Split every tensor of ``batch`` along axis 0 into ``k`` near-equal micro-batches."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"number of micro-batches must be a positive int, got {k!r}")
    n = batch[0].shape[0]
    for t in batch:
        if t.shape[0] != n:
            raise ValueError(f"batch tensors differ in length along axis 0: "
                             f"{[tuple(u.shape) for u in batch]}")
    if k > n:
        raise ValueError(f"cannot split a batch of {n} into {k} micro-batches")
    return [[Tensor.make_const(t.realize_cached_data()[start:end].compact()) for t in batch]
            for start, end in near_equal_bounds(n, k)]


def accumulate_gradients(loss_fn: Callable[..., Tensor], micro_batches: Iterable[Sequence[Any]],
                         params: Sequence[Tensor], optimizer: Optional[Any] = None) -> float:
    """Sum size-weighted gradients of ``loss_fn(*mb)`` (a micro-batch's *mean* loss) into ``p.grad``
    and step ``optimizer``; returns the whole batch's mean loss."""
    batches = [list(mb) for mb in micro_batches]
    if not batches:
        raise ValueError("accumulate_gradients needs at least one micro-batch")
    params = unique_by_identity(params)
    sizes = [mb[0].shape[0] for mb in batches]
    total = sum(sizes)
    acc: List[Optional[Any]] = [None] * len(params)
    loss_sum = 0.0
    for mb, size in zip(batches, sizes):
        for p in params:
            p.grad = None
        loss = loss_fn(*mb)
        weight = size / total
        (loss * weight).backward(create_graph=False)
        loss_sum += float(loss.numpy()) * weight
        with no_grad():
            for i, p in enumerate(params):
                if p.grad is None:
                    continue
                g = p.grad.realize_cached_data()
                acc[i] = g if acc[i] is None else acc[i] + g
        del loss
    for p, g in zip(params, acc):
        p.grad = Tensor.make_const(g) if g is not None else None
    if optimizer is not None:
        optimizer.step()
    return loss_sum
