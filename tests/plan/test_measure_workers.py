"""``--cluster here`` runs its measuring workers from the checkout's tools/measure/."""
import pytest

from needle.plan import cluster
from needle.plan.__main__ import main


def test_workers_are_found_beside_needle():
    assert cluster.worker_module("pingpong") == "tools.measure.pingpong"
    assert (cluster.CHECKOUT / "tools" / "measure" / "core_sharing.py").is_file()


def test_without_the_checkout_cluster_here_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cluster, "CHECKOUT", tmp_path)  # needle installed without its clone
    with pytest.raises(FileNotFoundError, match="tools/measure/pingpong.py"):
        cluster.worker_module("pingpong")
    assert main(["--model", "gpt2-small", "--batch", "8", "--cluster", "here",
                 "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m needle.plan: error: ") and "clone of needle" in err
