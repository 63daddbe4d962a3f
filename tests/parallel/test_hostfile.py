"""Host files are checked before mpiexec starts, and the launcher refuses a missing script in
one line: bad lines once made hydra spin for ever (``:-2``) or exit 248 without a word."""
import subprocess
import sys

import pytest
from mpi_helpers import ROOT, worker_env

from needle.parallel import hostfile
from needle.parallel.launch import build_command

BAD = [  # (line, words of the error)
    ("localhost:-2", "slots '-2' must be a whole number"),
    ("localhost:0", "slots '0' must be a whole number"),
    ("localhost:abc", "slots 'abc' must be a whole number"),
    ("localhost:\u0663", "slots '\u0663' must be a whole number in [1, 65536] (ASCII digits)"),
    ("localhost:\u00b2", "slots '\u00b2' must be a whole number"),  # '²'.isdigit() is True
    ("localhost:", "slots '' must be"),
    (":2", "'' is not a host name"),
    ("local host:2", "'local host' is not a host name"),
    ("localhost:2:3", "slots '2:3'"),
    ("localhost:99999999", "slots '99999999'"),
    ("node2 slots=-1", "slots '-1'"),
    ("node2 slots=4 max_slots=8", "'node2 slots=4 max_slots=8' is not a host name"),
]


@pytest.mark.parametrize("line,words", BAD, ids=[ascii(b[0]) for b in BAD])
def test_a_bad_line_is_refused_naming_it(tmp_path, line, words):
    path = tmp_path / "hosts"
    path.write_text(f"# two hosts\nnode1:2\n{line}\n")
    with pytest.raises(hostfile.HostfileError) as info:
        hostfile.parse(str(path))
    assert f"host file {path}, line 3 ({line!r})" in str(info.value) and words in str(info.value)


def test_duplicate_and_empty_files_are_refused(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node1:2\nnode2\nnode1:4\n")
    with pytest.raises(hostfile.HostfileError, match="line 3: host 'node1' is already on line 1"):
        hostfile.parse(str(path))
    path.write_text("# nobody\n\n")
    with pytest.raises(hostfile.HostfileError, match="names no host"):
        hostfile.parse(str(path))


def test_good_lines_parse(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node-1:2  # rack A\n\n10.0.0.2\n  node3 : 4 \nnode4 slots=3\n")
    assert hostfile.parse(str(path)) == [("node-1", 2), ("10.0.0.2", 1), ("node3", 4),
                                         ("node4", 3)]


def test_the_launcher_refuses_a_bad_host_file_before_mpiexec(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr("needle.parallel.mpiexec.find", lambda: started.append(1) or "x")
    hosts, script = tmp_path / "hosts", tmp_path / "s.py"
    hosts.write_text("localhost:-2\n")
    script.write_text("")
    with pytest.raises(SystemExit) as info:
        build_command(["-n", "2", "-f", str(hosts), str(script)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and not started
    assert err.count("\n") == 1 and "line 1 ('localhost:-2')" in err, err


def test_the_launcher_refuses_a_missing_script_in_one_line(tmp_path):
    missing = tmp_path / "nope.py"
    out = subprocess.run([sys.executable, "-m", "needle.parallel.launch", "-n", "2",
                          str(missing)], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=worker_env(), stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"python -m needle.parallel.launch: error: no such script: {missing}\n"
