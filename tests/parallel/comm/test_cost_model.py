"""The alpha-beta cost model: fitting, and predicting a traced ring allreduce."""
import numpy as np
import pytest

from needle.parallel import virtual
from needle.parallel.comm.communicator import Communicator
from needle.parallel.comm.cost_model import CostModel, TwoLevelModel, allreduce_steps


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
    assert model.predict(payload) == pytest.approx(model.ring_allreduce(nbytes, p))
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
    steps = allreduce_steps(algorithm, n, TWO_BY_TWO)
    assert model.schedule(steps, TWO_BY_TWO) == pytest.approx(want(n), rel=1e-12)


def test_two_level_model_link_bound_ratio_is_one_and_a_half():
    model = TwoLevelModel(CostModel(0, 0), CostModel(0, 1e-8))
    ring, hier = (model.schedule(allreduce_steps(a, 64 << 20, TWO_BY_TWO), TWO_BY_TWO)
                  for a in ("ring", "hierarchical"))
    assert ring / hier == pytest.approx(1.5)


def test_two_level_model_on_one_host_is_the_one_level_model():
    intra = CostModel(2e-6, 1e-10)
    model = TwoLevelModel(intra, CostModel(1.0, 1.0))
    steps = allreduce_steps("ring", 4 * 3000, [0, 0, 0, 0])
    assert model.schedule(steps, [0] * 4) == pytest.approx(intra.ring_allreduce(4 * 3000, 4))


def test_allreduce_steps_bad_input():
    with pytest.raises(ValueError, match="not a power of two"):
        allreduce_steps("recursive_doubling", 8, [0, 0, 1])
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'bogus'"):
        allreduce_steps("bogus", 8, [0, 1])
