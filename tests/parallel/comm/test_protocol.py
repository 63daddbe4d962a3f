"""The Comm protocol names what strategies use: the communicator (one class, over MPI or on the
virtual cluster) has every member of it (mypy checks the class too); an object lacking one is not.
"""
from needle.parallel import virtual
from needle.parallel.comm.protocol import Comm


def _is_comm(comm) -> bool:
    return isinstance(comm, Comm)


def test_the_virtual_clusters_communicator_is_a_comm():
    assert virtual.run(2, _is_comm, timeout=30) == [True, True]


def test_an_object_without_the_collectives_is_not_a_comm():
    class RankOnly:
        rank, size = 0, 1

    assert not isinstance(RankOnly(), Comm)
