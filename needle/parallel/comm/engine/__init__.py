"""The call engine: the ``Communicator`` class, its table of collectives, argument checks
(own-rank and cross-rank), array conversion and the result pool."""
