"""What messages travel over: MPI (started on first use) or the in-process virtual cluster with
its cooperative scheduler; each a ``progress.Transport``. Beside MPI, ``stuck.py``: the watchdog
for a rank stuck inside one MPI call."""
