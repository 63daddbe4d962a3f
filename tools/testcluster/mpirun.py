"""mpiexec across the test cluster's hosts, with no ssh: a launcher script enters each host.

MPICH's hydra starts one proxy per host with ``<launcher> -x HOST COMMAND`` (as it would call
``ssh``); ``-launcher-exec launcher.sh`` makes it call the script written here, which runs the
command in the host's network namespace and in a UTS namespace whose hostname is the host's name
(so ``MPI.Get_processor_name()`` tells the hosts apart).  mpiexec itself runs in host 0's
namespace, where it reaches every proxy and they reach it (``-iface eth0`` gives them host 0's
address to call back).  Ranks on different hosts are on different hydra "nodes", so MPICH sends
their messages through its network module (TCP over the veth links), never shared memory.
"""
import json
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional

from needle.parallel import mpiexec

LAUNCHER = "launcher.sh"
IFACE = "eth0"


def write_launcher(cluster: Any) -> Path:
    """Write ``launcher.sh`` into the cluster's folder: host address -> its namespace."""
    cases = "".join(f"  {cluster.address(i)}) ns={cluster.ns(i)} ;;\n"
                    for i in range(cluster.hosts))
    script = cluster.folder / LAUNCHER
    script.write_text(
        "#!/bin/sh\n"
        "# Called by mpiexec as `launcher.sh -x HOST COMMAND...` in place of ssh.\n"
        '[ "$1" = "-x" ] && shift\n'
        'host="$1"; shift\n'
        'case "$host" in\n'
        f"{cases}"
        '  *) echo "needle testcluster: no host $host in this cluster" >&2; exit 255 ;;\n'
        "esac\n"
        # The command arrives as ssh would pass it: words to be read again by a shell.
        'exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec $*"\n')
    script.chmod(0o755)
    return script


def cluster_of(hostfile: str) -> Optional[Dict[str, Any]]:
    """The test cluster a hostfile belongs to (its ``cluster.json``), or None for real hosts."""
    meta = Path(hostfile).resolve().parent / "cluster.json"
    return json.loads(meta.read_text()) if meta.exists() else None


def netmod_env() -> Dict[str, str]:
    """Environment making MPICH's network module use TCP on the host link (``eth0``).

    Measured here: left to itself, the mpich wheel's default network module finds the other
    "hosts" on the same machine and moves their messages through shared memory (the veth
    counters stay near zero); libfabric's tcp provider on eth0 puts every byte on the link."""
    return {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE}


def mpiexec_command(exe: str, hostfile: str, nproc: int) -> List[str]:
    """``mpiexec -n nproc -f hostfile`` and, for a test cluster, what makes it reach the hosts
    (the program and its arguments follow)."""
    return in_cluster(mpiexec.command(nproc, hostfile, exe), hostfile)


def in_cluster(cmd: List[str], hostfile: str) -> List[str]:
    """mpiexec's command line ``cmd`` run so that it reaches the test cluster's hosts (``cmd``
    itself for real hosts): the launcher's ``wrap``."""
    meta = cluster_of(hostfile)
    if meta is None:
        return cmd
    folder = Path(hostfile).resolve().parent
    env = [f"{k}={v}" for k, v in netmod_env().items()]
    ns0 = meta["host"][0]["netns"]
    return ["ip", "netns", "exec", ns0, "unshare", "--uts", "sh", "-c",
            f'hostname {ns0} && exec "$@"', "sh", "env", *env, *cmd,
            "-launcher", "ssh", "-launcher-exec", str(folder / LAUNCHER), "-iface", IFACE]


def shell_line(cmd: List[str]) -> str:
    """The command as one shell line (for printing)."""
    return " ".join(shlex.quote(c) for c in cmd)


__all__ = ["write_launcher", "cluster_of", "mpiexec_command", "in_cluster", "netmod_env",
           "shell_line"]
