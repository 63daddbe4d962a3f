"""``python -m tools.testcluster up|down|sweep|command|launch``: the test cluster by hand."""
import argparse
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from needle import cli
from needle.parallel import launch

from .mpirun import in_cluster, mpiexec_command, shell_line
from .netns import ClusterUnavailable, NamespaceHosts, _remove, sweep


def launch_on(folder: str, launcher_args: List[str]) -> int:
    """``python -m needle.parallel.launch -f FOLDER/hostfile launcher_args...`` with mpiexec
    started inside the cluster (the launcher itself knows nothing of namespaces)."""
    hostfile = str(Path(folder) / "hostfile")
    return launch.main(["-f", hostfile] + launcher_args,
                       wrap=lambda cmd: in_cluster(cmd, hostfile))


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line and do it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # the rest is the launcher's, script arguments included
        if len(argv) < 2:
            sys.stderr.write("python -m tools.testcluster launch: give the cluster's folder, "
                             "then the launcher's arguments (-n 4 script.py)\n")
            return 2
        return launch_on(argv[1], argv[2:])
    p = cli.Parser(prog="python -m tools.testcluster",
                   description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="make a cluster and print its folder (holds the hostfile)")
    up.add_argument("--hosts", type=cli.count_type(lo=1), default=2)
    up.add_argument("--slots", type=cli.count_type(lo=1), default=2,
                    help="ranks per host in the hostfile")
    up.add_argument("--rate", help="shape every host link, e.g. 1gbit (tc tbf)")
    down = sub.add_parser("down", help="remove a cluster (its folder or name)")
    down.add_argument("cluster", nargs="?")
    down.add_argument("--all", action="store_true", help="every cluster made by this module")
    sub.add_parser("sweep", help="remove clusters whose making process has exited")
    show = sub.add_parser("command", help="print the mpiexec command for a hostfile")
    show.add_argument("hostfile")
    show.add_argument("-n", type=cli.count_type(lo=1), default=2)
    sub.add_parser("launch", help="FOLDER [launcher arguments]: needle.parallel.launch across "
                   "the cluster's hosts")
    args = p.parse_args(argv)
    if args.cmd == "up":
        return _up(args)
    if args.cmd == "down":
        if args.all:
            print("\n".join(sweep(everything=True)))
        elif args.cluster:
            _remove(args.cluster.rstrip("/").split("/")[-1])
        else:
            p.error("down: give the cluster's folder or name, or --all")
        return 0
    if args.cmd == "sweep":
        print("\n".join(sweep()))
        return 0
    print(shell_line(mpiexec_command("mpiexec", args.hostfile, args.n)))
    return 0


def _up(args: argparse.Namespace) -> int:
    """Make the cluster under a name that outlives this process (``down`` removes it)."""
    # A name without this process's pid: `sweep` would otherwise remove it once we exit.
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    k = 1
    while f"ndlh-0-{k}-" in probe.stdout:
        k += 1
    cluster = NamespaceHosts(args.hosts, args.slots, args.rate, name=f"ndlh-0-{k}")
    try:
        cluster.up()
    except ClusterUnavailable as e:
        print(f"needle testcluster: cannot make the cluster here: {e}", file=sys.stderr)
        return 2
    cluster.is_up = False  # keep it after exit
    print(cluster.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
