"""The communicator's errors: a collective past its deadline, and the in-process cluster's
deadlock (every rank waits and no message can arrive)."""


class CommTimeoutError(RuntimeError):
    """A collective did not finish within the communicator's timeout."""


class DeadlockError(CommTimeoutError):
    """Every rank of the in-process cluster waits and no message can ever arrive."""
