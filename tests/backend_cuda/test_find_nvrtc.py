"""compile_check finds NVRTC and the CUDA headers in each layout they come in: the CUDA 12 pip
wheels, the CUDA 13 wheels (a GPU image may have only these), and a toolkit folder."""
from pathlib import Path

from needle.backend_cuda import compile_check as cc


def _touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return str(path)


def _only(monkeypatch, site: Path, cuda_path: str = "") -> None:
    """Search only ``site`` (and the toolkit folder ``cuda_path``, if given)."""
    monkeypatch.setattr(cc, "_site_dirs", lambda: [str(site)])
    monkeypatch.delenv("NEEDLE_NVRTC", raising=False)
    monkeypatch.setattr(cc, "_cuda_roots", lambda: [cuda_path] if cuda_path else [])


def test_cuda12_wheels(tmp_path, monkeypatch):
    nv = tmp_path / "site-packages" / "nvidia"
    lib = _touch(nv / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    _touch(nv / "cuda_nvrtc" / "lib" / "libnvrtc-builtins.so.12.9")
    _touch(nv / "cuda_runtime" / "include" / "cuda_fp16.h")
    _only(monkeypatch, tmp_path / "site-packages")
    assert cc.find_nvrtc() == lib
    assert cc.find_cuda_include() == str(nv / "cuda_runtime" / "include")


def test_cuda13_wheels_take_the_headers_beside_their_nvrtc(tmp_path, monkeypatch):
    nv = tmp_path / "site-packages" / "nvidia"
    lib = _touch(nv / "cu13" / "lib" / "libnvrtc.so.13")
    _touch(nv / "cu13" / "include" / "cuda_fp16.h")
    _touch(nv / "cuda_runtime" / "include" / "cuda_fp16.h")  # another version's headers too
    _only(monkeypatch, tmp_path / "site-packages")
    assert cc.find_nvrtc() == lib
    assert cc.find_cuda_include() == str(nv / "cu13" / "include")


def test_a_toolkit_folder_when_no_wheel_has_it(tmp_path, monkeypatch):
    lib = _touch(tmp_path / "cuda" / "lib64" / "libnvrtc.so.13")
    _touch(tmp_path / "cuda" / "include" / "cuda_fp16.h")
    (tmp_path / "site-packages").mkdir()
    _only(monkeypatch, tmp_path / "site-packages", str(tmp_path / "cuda"))
    assert cc.find_nvrtc() == lib
    assert cc.find_cuda_include() == str(tmp_path / "cuda" / "include")


def test_none_when_absent(tmp_path, monkeypatch):
    _only(monkeypatch, tmp_path)
    assert cc.find_nvrtc() is None and cc.find_cuda_include() is None
