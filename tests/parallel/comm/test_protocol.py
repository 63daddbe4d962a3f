"""The Comm protocol names what strategies use: the communicator (one class, over MPI or on the
virtual cluster) has every member of it (mypy checks the class too); an object lacking one is not.
"""
import inspect

import pytest

from needle.parallel import virtual
from needle.parallel.comm import Communicator
from needle.parallel.comm.protocol import Comm

METHODS = [m for m in vars(Comm) if not m.startswith("_") and callable(getattr(Comm, m))]


def _is_comm(comm) -> bool:
    return isinstance(comm, Comm)


def test_the_virtual_clusters_communicator_is_a_comm():
    assert virtual.run(2, _is_comm, timeout=30) == [True, True]


def test_an_object_without_the_collectives_is_not_a_comm():
    class RankOnly:
        rank, size = 0, 1

    assert not isinstance(RankOnly(), Comm)


@pytest.mark.parametrize("name", METHODS)
def test_each_protocol_method_has_the_communicators_parameters(name):
    """Same names, order, kinds (positional or keyword-only) and defaults as the class's."""
    def params(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
    assert params(getattr(Comm, name)) == params(getattr(Communicator, name))
