"""The busiest rank's sends in closed form against the algorithms' declarations summed rank by
rank, call by call and plan by plan; and the planner answering for 10^6 GPUs."""
import subprocess
import sys

import numpy as np
import pytest

from needle.parallel.comm.algorithms.cost_model import CostModel
from needle.plan import cluster, collective_sends, comm_time
from needle.plan.collective_sends import RANK_BY_RANK, busiest, rank_by_rank
from needle.plan.layout import Setup
from needle.plan.model import ModelSpec, preset
from needle.plan.rank import plan

SMALL_P = list(range(1, 130)) + [255, 256, 257, 1000, 1024]


def _items(p):
    """Pieces around p (segments of 0, 1 and 2 items, uneven) and around the 64 KiB choices."""
    return sorted({1, 3, max(p - 1, 1), p, p + 1, 2 * p + 3, 8191, 8192, 8193, 16384, 16385,
                   32768, 32769, 100003})


@pytest.mark.parametrize("name", ["allreduce", "allgather", "reduce_scatter", "send"])
def test_busiest_is_the_rank_by_rank_maximum(name):
    """Most messages and most bytes, and one rank has both (so any alpha-beta price agrees)."""
    for p in SMALL_P:
        for items in _items(p):
            for itemsize in (2, 4):
                ref = rank_by_rank(name, items, itemsize, p)
                msgs, nbytes = ref.msgs[0], ref.nbytes[0]
                got = busiest(name, items, itemsize, p)
                key = (name, items, itemsize, p)
                assert got.msgs.shape == (1, 1), key
                assert got.msgs[0, 0] == msgs.max() and got.nbytes[0, 0] == nbytes.max(), key
                assert np.any((msgs == msgs.max()) & (nbytes == nbytes.max())), key
                for model in (CostModel(1e-5, 1e-10), CostModel(5e-6, 1 / 300e9)):
                    assert model.seconds(got) == model.seconds(ref), key


@pytest.mark.parametrize("p", [2047, 4096, 4099])
def test_busiest_at_thousands_of_ranks(p):
    """A ring over thousands of ranks, uneven segments (the dp allreduce of a big model)."""
    for items in (10**6 + 7, 7 * 10**6 // 3):
        ref = rank_by_rank("allreduce", items, 2, p)
        got = busiest("allreduce", items, 2, p)
        assert (got.msgs[0, 0], got.nbytes[0, 0]) == (ref.msgs.max(), ref.nbytes.max())


def test_ring_allreduce_by_hand():
    """p = 4, 10 float32s: segments of 3, 3, 2, 2 items; rank r sends all four, then all but
    r + 1 and r + 2 (6 sends); rank 1 skips the two short ones: 16 items = 64 bytes.
    p = 3, 20000 float32s (80 KB, above recursive doubling's 64 KiB), segments of 6667, 6667
    and 6666: 4 sends, all three segments and a long one again."""
    got = busiest("allreduce", 10, 4, 4)
    assert (got.msgs[0, 0], got.nbytes[0, 0]) == (2, 2 * 40)  # 40 B: recursive doubling
    folded = rank_by_rank("allreduce", 10, 4, 4, "ring")
    assert list(folded.nbytes[0]) == [4 * (20 - 3 - 2), 4 * (20 - 2 - 2), 4 * (20 - 2 - 3),
                                      4 * (20 - 3 - 3)]
    big = busiest("allreduce", 20000, 4, 3)
    assert (big.msgs[0, 0], big.nbytes[0, 0]) == (4, 4 * (20000 + 6667))
    ag = busiest("allgather", 100003, 4, 6)  # ring (6 is not 2^k): 5 sends of one piece
    assert (ag.msgs[0, 0], ag.nbytes[0, 0]) == (5, 5 * 400012)


GPT2 = preset("gpt2-small")
CASES = [(gpus, spec, opt) for gpus in (1, 2, 6, 8, 24, 64, 96, 512)
         for spec, opt in ((GPT2, "adamw"), (preset("llama-7b"), "sgd"),
                           (ModelSpec(params=7e9, name="params"), "adam"))]
CASES += [(4096, preset("llama-70b"), "adamw"), (4096, ModelSpec(params=7e9, name="p"), "sgd")]


def _summary(preds):
    return [(p.layout, p.precision, p.fits, p.why_not, p.step_seconds, p.bytes_per_step,
             p.parts) for p in preds]


@pytest.mark.parametrize("gpus,spec,opt", CASES,
                         ids=[f"{g}-{s.name}-{o}" for g, s, o in CASES])
def test_plans_equal_the_rank_by_rank_plans(monkeypatch, gpus, spec, opt):
    """Every layout's step time, parts and bytes, and the order, as when every collective was
    summed rank by rank (the planner before the closed form)."""
    gpn = min(8, gpus)
    cl = cluster.preset("dgx-a100-80g", nodes=gpus // gpn, gpus_per_node=gpn)
    setup = Setup(max(gpus, 8), "any", opt)
    fast = plan(spec, setup, cl)
    monkeypatch.setattr(comm_time, "busiest", rank_by_rank)
    slow = plan(spec, setup, cl)
    assert all(p.bytes_per_step > 0 for p in fast if p.fits and p.layout.dp > 1)
    assert _summary(fast) == _summary(slow)


def test_the_planner_sums_nothing_rank_by_rank(monkeypatch):
    """At 4,096 GPUs no collective is summed rank by rank (each call is O(1) in its ranks)."""
    def refuse(*key):
        raise AssertionError(f"summed rank by rank: {key}")
    monkeypatch.setattr(collective_sends, "collective_steps", refuse)
    monkeypatch.setattr(collective_sends, "rank_by_rank", refuse)
    preds = plan(GPT2, Setup(4096), cluster.preset("dgx-a100-80g", nodes=512))
    assert sum(p.fits for p in preds) > 100


def test_an_algorithm_without_a_closed_form_is_summed_up_to_the_bound(monkeypatch):
    """The hierarchical allreduce (which the planner's groups never run): rank by rank up to
    RANK_BY_RANK ranks, refused above it naming the bound."""
    monkeypatch.setattr(collective_sends, "choose", lambda *a: "hierarchical")
    got = busiest("allreduce", 10**6, 4, 8)
    assert got.msgs.shape == (1, 8)
    assert got.nbytes.max() == rank_by_rank("allreduce", 10**6, 4, 8, "hierarchical").nbytes.max()
    with pytest.raises(ValueError, match=f"hierarchical on {RANK_BY_RANK + 1} ranks: no closed "
                                         f"form, .* only up to {RANK_BY_RANK} ranks"):
        busiest("allreduce", 10**6, 4, RANK_BY_RANK + 1)


@pytest.mark.parametrize("argv", [["--gpus", "1000000", "--model", "llama-70b"],
                                  ["--gpus", "10000000", "--params", "7e9"]])
def test_a_million_gpus_is_answered(argv):
    """Once refused (above 16,384 GPUs); a generous wall-clock bound, not a timing claim."""
    out = subprocess.run([sys.executable, "-m", "needle.plan", *argv], capture_output=True,
                         text=True, timeout=180, check=True).stdout
    nodes = int(argv[1]) // 8
    assert f"cluster dgx-a100-80g: {nodes} x 8 GPUs" in out, out
    assert "  1. " in out and " layouts fit" in out, out
