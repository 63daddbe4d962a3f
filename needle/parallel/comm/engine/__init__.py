"""The call engine: the ``Communicator``, its table of collectives (each glued to the
algorithms of ``select.ALGORITHMS``), point-to-point calls, argument checks (own-rank and
cross-rank), array conversion and the result pool."""
