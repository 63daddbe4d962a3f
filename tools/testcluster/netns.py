"""Making and removing the test cluster: K network namespaces ("hosts") behind one bridge.

Layout of a cluster named ``ndlh-<pid>-<n>`` (the pid of the process that made it, so leftovers
of a dead process can be found and removed by ``sweep``):

    namespace ndlh-<pid>-<n>-br   bridge br0, ports v0 .. v{K-1}     (the "switch")
    namespace ndlh-<pid>-<n>-h<i> eth0 = 10.213.<s>.<i+1>/24, lo      (host i)

The veth pairs are created inside the bridge namespace, so the machine's own namespace never
sees a device of ours, and no namespace of ours has a route anywhere but its /24.  With a rate,
both ends of every host link get a ``tc tbf`` root qdisc (each direction shaped).
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PREFIX = "ndlh"
_counter = [0]


class ClusterUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, no permission)."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip args`` and return its stdout; a failure raises with ip's own message."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def available() -> Optional[str]:
    """None where namespaces can be made, else the reason why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "making network namespaces needs root (and Linux)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed"
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"cannot make a network namespace: {e}"
    ip("netns", "del", probe, check=False)
    return None


def parse_rate(rate: str) -> float:
    """Bits per second of a tc rate such as ``1gbit``, ``200mbit`` or ``500kbit``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.strip().lower())
    if m is None:
        raise ValueError(f"rate {rate!r}: give it as tc does, e.g. 1gbit, 200mbit, 500kbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


class NamespaceHosts:
    """``hosts`` namespaces with ``slots`` ranks each; ``up()`` makes it, ``down()`` removes it.

    Use it as a context manager (``with NamespaceHosts(2) as c:``): it is removed on exit, on an
    exception, and at interpreter exit if still up."""

    def __init__(self, hosts: int, slots: int = 1, rate: Optional[str] = None,
                 name: Optional[str] = None) -> None:
        if hosts < 1 or hosts > 250 or slots < 1:
            raise ValueError(f"need 1 <= hosts <= 250 and slots >= 1, got {hosts}, {slots}")
        self.rate_bps = parse_rate(rate) if rate else None
        _counter[0] += 1
        self.name = name or f"{PREFIX}-{os.getpid()}-{_counter[0]}"
        self.hosts, self.slots, self.rate = hosts, slots, rate
        self.subnet = f"10.213.{os.getpid() % 250}"
        self.folder = Path(tempfile.gettempdir()) / self.name
        self.is_up = False

    # -- names ---------------------------------------------------------------------------
    @property
    def bridge_ns(self) -> str:
        """The namespace holding the bridge (the switch between the hosts)."""
        return f"{self.name}-br"

    def ns(self, i: int) -> str:
        """Host i's namespace."""
        return f"{self.name}-h{i}"

    def address(self, i: int) -> str:
        """Host i's address (also its name in the hostfile)."""
        return f"{self.subnet}.{i + 1}"

    @property
    def hostfile(self) -> Path:
        """MPI's hostfile: one ``address:slots`` line per host."""
        return self.folder / "hostfile"

    def host_of(self, address: str) -> int:
        """The index of the host with this address."""
        for i in range(self.hosts):
            if self.address(i) == address:
                return i
        raise KeyError(f"no host {address!r} in cluster {self.name}")

    # -- making and removing -------------------------------------------------------------
    def up(self) -> "NamespaceHosts":
        """Make the namespaces, links, addresses and hostfile (refuses with the reason)."""
        reason = available()
        if reason is not None:
            raise ClusterUnavailable(reason)
        atexit.register(self.down)
        self.is_up = True
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        return self

    def _make(self) -> None:
        br = self.bridge_ns
        ip("netns", "add", br)
        ip("-n", br, "link", "set", "lo", "up")
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        for i in range(self.hosts):
            self._make_host(i)
        self.folder.mkdir(exist_ok=True)
        self.hostfile.write_text("".join(f"{self.address(i)}:{self.slots}\n"
                                         for i in range(self.hosts)))
        (self.folder / "cluster.json").write_text(json.dumps(self.describe(), indent=1))
        from .mpirun import write_launcher
        write_launcher(self)

    def _make_host(self, i: int) -> None:
        br, h = self.bridge_ns, self.ns(i)
        ip("netns", "add", h)
        ip("-n", br, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
           "netns", h)
        ip("-n", br, "link", "set", f"v{i}", "master", "br0", "up")
        ip("-n", h, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        ip("-n", h, "link", "set", "eth0", "up")
        ip("-n", h, "link", "set", "lo", "up")
        if self.rate:
            self._shape(h, "eth0")
            self._shape(br, f"v{i}")

    def _shape(self, ns: str, dev: str) -> None:
        """A token bucket on ``dev``'s egress: ``rate``, a burst of ~1 ms of it and at least two
        64 KiB segments (a bucket smaller than the veth's largest GSO segment stalls tbf; a
        burst of ~4 ms carried half of a 1 MiB message at once, faster than any wire)."""
        assert self.rate is not None and self.rate_bps is not None  # only called with a rate
        burst = max(int(self.rate_bps / 8 / 1000), 128 * 1024)
        cmd = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
               "burst", str(burst), "latency", "50ms"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")

    def down(self) -> None:
        """Remove every namespace (and so every link) of this cluster, and its folder."""
        if not self.is_up:
            return
        self.is_up = False
        _remove(self.name)
        try:
            atexit.unregister(self.down)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    def __enter__(self) -> "NamespaceHosts":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- state ---------------------------------------------------------------------------
    def describe(self) -> Dict[str, object]:
        """The cluster as JSON-able data (written to ``cluster.json`` beside the hostfile)."""
        return {"name": self.name, "hosts": self.hosts, "slots": self.slots, "rate": self.rate,
                "subnet": self.subnet,
                "host": [{"address": self.address(i), "netns": self.ns(i)}
                         for i in range(self.hosts)]}

    def link_bytes(self, i: int) -> Tuple[int, int]:
        """(bytes sent, bytes received) so far on host i's link (its eth0)."""
        stats = json.loads(ip("-j", "-s", "-n", self.ns(i), "link", "show", "eth0"))[0]
        return stats["stats64"]["tx"]["bytes"], stats["stats64"]["rx"]["bytes"]

    def set_link(self, i: int, up: bool) -> None:
        """Take host i's link down (``ip link set v<i> down`` at the bridge) or up again."""
        ip("-n", self.bridge_ns, "link", "set", f"v{i}", "up" if up else "down")


def _ours() -> List[str]:
    """The namespaces of every cluster made by this module (of any process)."""
    out = ip("netns", "list", check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX + "-")]


def _remove(name: str) -> None:
    """Kill what still runs in the namespaces ``name-*`` (the cluster's own ranks and proxies:
    a namespace lives on while a process holds it), delete them and the cluster's folder."""
    for ns in _ours():
        if ns.startswith(name + "-"):
            for pid in ip("netns", "pids", ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns, check=False)
    shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


def leftovers() -> List[str]:
    """Namespaces of ours still present (for tests: none should outlive its cluster)."""
    return _ours()


def sweep(everything: bool = False) -> List[str]:
    """Remove clusters whose making process is gone (all of ours with ``everything``)."""
    gone = set()
    for ns in _ours():
        m = re.match(rf"^({PREFIX}-(\d+)-[^-]+)-", ns)
        if m is None:
            continue
        pid = int(m.group(2))  # 0: made by hand (`testcluster up`), kept until `down`
        if everything or (pid != 0 and not Path(f"/proc/{pid}").exists()):
            gone.add(m.group(1))
    for name in sorted(gone):
        _remove(name)
    return sorted(gone)
