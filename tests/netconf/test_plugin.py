"""Network plugin: found on the library path? used according to the log?"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.netconf.plugin import classify_log, find_plugins

LOGS = Path(__file__).parents[1] / "fixtures" / "nccl_logs"

CASES = [
    ("course_ofi_plugin.txt", "ofi-plugin", "aws-ofi-rccl 1.4.0", ()),
    ("course_socket_nmn0.txt", "socket", None, ("nmn0", "hsn0", "hsn1", "hsn2", "hsn3")),
    ("written_nvidia_ib.txt", "ib", None, ()),
    ("written_rccl_socket_fallback.txt", "socket", None, ("hsn0", "hsn1", "hsn2", "hsn3")),
]


@pytest.mark.parametrize(("log", "transport", "plugin", "interfaces"), CASES,
                         ids=[c[0] for c in CASES])
def test_classify_log(log: str, transport: str, plugin: str | None, interfaces: tuple) -> None:
    summary = classify_log((LOGS / log).read_text())
    assert summary.transport == transport
    assert summary.plugin == plugin
    assert summary.interfaces == interfaces


def test_versions_and_errors_are_picked_up() -> None:
    course = classify_log((LOGS / "course_socket_nmn0.txt").read_text())
    assert course.version == "2.12.12"
    assert any("unhandled" in error.lower() for error in course.errors)
    assert classify_log((LOGS / "written_nvidia_ib.txt").read_text()).version == "2.21.5+cuda12.4"


def test_find_plugins_on_library_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "librccl-net.so").write_bytes(b"")
    (second / "libnccl-net-ofi.so.1").write_bytes(b"")
    (second / "libother.so").write_bytes(b"")
    found = find_plugins({"LD_LIBRARY_PATH": f"{first}:{second}"})
    ours = [p for p in found if p.startswith(str(tmp_path))]
    assert ours == [str(first / "librccl-net.so"), str(second / "libnccl-net-ofi.so.1")]
    assert not [p for p in find_plugins({}) if p.startswith(str(tmp_path))]
