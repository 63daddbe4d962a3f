"""The planner's measuring workers, run under mpiexec by ``python -m needle.plan --cluster here``
(``needle/plan/cluster.py``) as ``python -m needle.plan.measure.<worker> out.json``."""
