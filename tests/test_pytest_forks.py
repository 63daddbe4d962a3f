"""course/pytest_forks.py: each session is a forked child that imports the files as they are
when it starts, and a session past the time limit is killed with what it started."""
import textwrap

from course import pytest_forks

TEST = textwrap.dedent('''\
    import time

    import answer


    def test_answer():
        assert answer.VALUE == 1


    def test_hang():
        time.sleep(60)
''')


def test_a_file_changed_between_sessions_is_what_the_next_one_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "test_forked.py").write_text(TEST)
    args = ["-q", "-p", "no:cacheprovider", "-k", "answer", "test_forked.py"]
    (tmp_path / "answer.py").write_text("VALUE = 1\n")
    assert pytest_forks.run(args, str(tmp_path / "1.txt"), timeout=120) == 0
    (tmp_path / "answer.py").write_text("VALUE = 2  # changed\n")
    assert pytest_forks.run(args, str(tmp_path / "2.txt"), timeout=120) == 1
    assert "assert 2 == 1" in (tmp_path / "2.txt").read_text()


def test_a_session_past_the_limit_is_killed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_forked.py").write_text(TEST)
    (tmp_path / "answer.py").write_text("VALUE = 1\n")
    args = ["-q", "-p", "no:cacheprovider", "-k", "hang", "--rootdir", str(tmp_path),
            "test_forked.py"]
    assert pytest_forks.run(args, str(tmp_path / "out.txt"), timeout=1) is None
