"""The alpha-beta cost model: fitting, and predicting a traced ring allreduce."""
import numpy as np
import pytest

from needle.parallel import virtual
from needle.parallel.comm.communicator import Communicator
from needle.parallel.comm.cost_model import CostModel


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
