"""Run under mpiexec by test_faults_hang.py: an ASP parameter server whose worker rank 2 stops
answering after two steps (alive, stuck in a sleep) while rank 1 trains on."""
import time

from ps_cases import tiny_asp_job

from needle.parallel import communicator
from needle.parallel.param_server.worker import train_worker


def main() -> None:
    comm = communicator.create()
    ps, model, batches, loss = tiny_asp_job(comm, 2.0)
    if ps.is_server:
        log = ps.serve()
        print("server done; presumed dead:", [e.worker for e in log if e.event == "dead"],
              flush=True)
    elif comm.rank == 2:
        train_worker(ps, model, loss, batches, 6, stop_after=2)
        time.sleep(1000)  # stuck, not dead
    else:
        print("worker 1 trained", len(train_worker(ps, model, loss, batches, 6)), "steps",
              flush=True)


if __name__ == "__main__":
    main()
