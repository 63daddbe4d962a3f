"""A cluster of "hosts" on one machine: network namespaces joined by a bridge, for multi-host tests.

    python -m tools.testcluster up --hosts 2 --slots 2 --rate 1gbit   # prints its folder
    python -m tools.testcluster launch FOLDER -n 4 script.py   # needle.parallel.launch across it
    python -m tools.testcluster down FOLDER      # or: down --all (every cluster of ours)

Run from the repository root (a tool of the checkout, not of the installed package).

Each host is a network namespace with one interface, ``eth0``, holding its own address; the hosts'
links meet at a bridge in a namespace of its own, so the machine's own network is never touched
and nothing can leave the cluster.  ``--rate`` shapes every host link in both directions with
``tc tbf`` (bandwidth only: ``netem`` delay and loss are not available here).  MPICH's mpiexec
starts its per-host proxies through a launcher script that enters the host's namespace (and a UTS
namespace named after the host) instead of ``ssh``, so no ssh daemon is needed (``mpirun.py``).

``netns.py`` makes and removes the namespaces; ``mpirun.py`` builds the mpiexec command line.
"""
from .netns import ClusterUnavailable, NamespaceHosts, available, sweep

__all__ = ["NamespaceHosts", "ClusterUnavailable", "available", "sweep"]
