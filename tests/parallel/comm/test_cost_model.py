"""The alpha-beta cost model: fitting, predicting a traced ring allreduce and declared steps, and
the two-level model by hand."""
import numpy as np
import pytest

from benchmarks.two_level_model import TwoLevelModel
from needle.parallel import virtual
from needle.parallel.comm.algorithms import select
from needle.parallel.comm.algorithms.cost_model import CostModel
from needle.parallel.comm.engine.communicator import Communicator


def textbook_ring(model: CostModel, nbytes: int, p: int) -> float:
    """``2 (p - 1) (alpha + N / p beta)`` (Thakur et al. 2005)."""
    return 2 * (p - 1) * (model.alpha + nbytes / p * model.beta)


def test_fit_recovers_alpha_and_beta() -> None:
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    true = CostModel(3e-6, 2e-10)
    fitted = CostModel.fit(sizes, [true.message(n) for n in sizes])
    assert fitted.alpha == pytest.approx(3e-6, rel=1e-6)
    assert fitted.beta == pytest.approx(2e-10, rel=1e-6)


def _ring(comm, n, chunk):
    Communicator(comm.transport, chunk_bytes=chunk).allreduce(np.ones(n, np.float32),
                                                              algorithm="ring")


@pytest.mark.parametrize("p", [2, 3, 4])
def test_trace_prediction_is_the_textbook_ring(p: int) -> None:
    model = CostModel(2e-6, 1e-10)
    nbytes = 4 * 12 * 1024
    cluster = virtual.Cluster(p, trace=True)
    cluster.run(_ring, nbytes // 4, 1 << 20)  # one piece per segment
    payload = [m for m in cluster.trace if m.nbytes > 16]  # not the argument check
    assert model.predict(payload) == pytest.approx(textbook_ring(model, nbytes, p))
    declared = select.steps("allreduce", "ring", nbytes, p, 4)
    assert model.seconds(declared) == pytest.approx(textbook_ring(model, nbytes, p))
    checks = [m for m in cluster.trace if m.nbytes == 16]
    assert model.predict(cluster.trace) > model.predict(payload) and checks
    # Pieces of 1 KiB: more messages, so more alpha, same bytes.
    cluster = virtual.Cluster(p, trace=True)
    cluster.run(_ring, nbytes // 4, 1024)
    pieces = [m for m in cluster.trace if m.nbytes > 16]
    assert sum(m.nbytes for m in pieces) == sum(m.nbytes for m in payload)
    assert model.predict(pieces) > model.predict(payload)


# -- two link classes --------------------------------------------------------------------------
AI, BI, AE, BE = 1e-6, 1e-10, 5e-5, 8e-9  # intra-host, inter-host alpha and beta
TWO_BY_TWO = [0, 0, 1, 1]


@pytest.mark.parametrize("algorithm, want", [
    # 6 steps of N/4; one message per step crosses each link: 6 (ae + N/4 be)
    ("ring", lambda n: 6 * (AE + n / 4 * BE)),
    # N/2 within, then 2 steps where both ranks of a host send N/4 across: N/2 on the link
    ("hierarchical", lambda n: 2 * (AI + n / 2 * BI) + 2 * (AE + n / 2 * BE)),
    # N within, then N from each of the 2 ranks of a host over one link: 2 N
    ("recursive_doubling", lambda n: AI + n * BI + AE + 2 * n * BE),
    # reduce: 1->0 and 3->2 within, 2->0 across; the broadcast back the same way
    ("tree", lambda n: 2 * (AI + n * BI + AE + n * BE)),
])
def test_two_level_model_by_hand_at_two_hosts_by_two(algorithm, want):
    model = TwoLevelModel(CostModel(AI, BI), CostModel(AE, BE))
    n = 1 << 20
    assert model.seconds(_steps(algorithm, n, TWO_BY_TWO), TWO_BY_TWO) == \
        pytest.approx(want(n), rel=1e-12)


def _steps(algorithm, n, nodes):
    """An allreduce's declared steps; ``tree``: binomial reduce to rank 0, then broadcast."""
    if algorithm == "tree":
        p = len(nodes)
        return select.steps("reduce", "binomial", n, p).then(
            select.steps("broadcast", "binomial", n, p))
    return select.steps("allreduce", algorithm, n, len(nodes), nodes=nodes)


def test_two_level_model_shares_a_link_among_unequal_messages():
    """3 ranks of host 0 send 1, 2 and 3 MB to host 1 at once: each gets a third of the link."""
    from needle.parallel.comm.algorithms.steps import Steps
    model = TwoLevelModel(CostModel(AI, BI), CostModel(AE, BE))
    steps = Steps.of([[3, 3, 3, -1]], [[1e6, 2e6, 3e6, 0]])
    assert model.seconds(steps, [0, 0, 0, 1]) == pytest.approx(AE + 3 * 3e6 * BE)
    alone = Steps.of([[3, -1, -1, -1]], [[3e6, 0, 0, 0]])
    assert model.seconds(alone, [0, 0, 0, 1]) == pytest.approx(AE + 3e6 * BE)


def test_two_level_model_link_bound_ratio_is_one_and_a_half():
    model = TwoLevelModel(CostModel(0, 0), CostModel(0, 1e-8))
    ring, hier = (model.seconds(_steps(a, 64 << 20, TWO_BY_TWO), TWO_BY_TWO)
                  for a in ("ring", "hierarchical"))
    assert ring / hier == pytest.approx(1.5)


def test_two_level_model_on_one_host_is_the_one_level_model():
    intra = CostModel(2e-6, 1e-10)
    model = TwoLevelModel(intra, CostModel(1.0, 1.0))
    steps = _steps("ring", 4 * 3000, [0, 0, 0, 0])
    assert model.seconds(steps, [0] * 4) == pytest.approx(textbook_ring(intra, 4 * 3000, 4))


def test_steps_bad_input():
    with pytest.raises(ValueError, match="needs a power-of-two number of ranks, not 3"):
        select.steps("allgather", "recursive_doubling", 8, 3)
    with pytest.raises(ValueError, match="unknown algorithm 'bogus'"):
        select.steps("allreduce", "bogus", 8, 2)
