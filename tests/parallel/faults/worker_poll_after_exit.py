"""Run under mpiexec by test_faults_poll.py: rank 1 leaves cleanly after one allreduce while
rank 0 polls ``Work.test()`` for a message from it that never comes."""
import numpy as np

from needle.parallel import communicator


def main() -> None:
    comm = communicator.create()
    comm.allreduce(np.ones(2))
    if comm.rank == 0:
        work = comm.irecv(1, tag=5)
        while not work.test():
            pass


if __name__ == "__main__":
    main()
