"""fa4.common.codegen_check's choice of CUDA binaries, with fake tools (no CUDA needed).

On the H200 image the system ptxas (CUDA 13.0, PTX ISA 9.0) came first on PATH while the CuTe DSL
emitted PTX ISA 9.4: test_softcap's ptxas -v failed there only. find_tool now takes the newest
release found, and a ptxas too old for the PTX says that it is the environment.
"""

import os
import stat

import pytest

from fa4.common import codegen_check as cc


def _fake(path, release: str, fail: str | None = None):
    """A shell-script ptxas/nvdisasm answering --version with ``release``, else printing ``fail``
    and exiting 1 (or succeeding silently)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = "" if fail is None else f"echo \"{fail}\" >&2; exit 1\n"
    with open(path, "w") as f:
        f.write("#!/bin/sh\nif [ \"$1\" = --version ]; then\n"
                f"  echo 'Cuda compilation tools, release {release}, V{release}.1'; exit 0\nfi\n{body}")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """An old ptxas first on PATH, a newer one and a middle one in fake wheel directories."""
    old = _fake(tmp_path / "sys" / "ptxas", "13.0", fail="ptxas fatal   : Unsupported .version 9.4; current version is '9.0'")
    new = _fake(tmp_path / "site" / "nvidia" / "cu13" / "bin" / "ptxas", "13.4")
    mid = _fake(tmp_path / "site" / "triton" / "backends" / "nvidia" / "bin" / "ptxas", "12.8")
    monkeypatch.setenv("PATH", str(tmp_path / "sys"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    real = cc.tool_candidates

    def cands(name):
        return [c for c in real(name) if c.startswith(str(tmp_path / "sys"))] + (
            [new, mid] if name == "ptxas" else [])

    monkeypatch.setattr(cc, "tool_candidates", cands)
    cc.tool_release.cache_clear()
    return old, new, mid


def test_release_is_read_from_version_output(tools):
    old, new, mid = tools
    assert [cc.tool_release(t) for t in tools] == [(13, 0), (13, 4), (12, 8)]


def test_find_tool_prefers_the_newest_release_over_the_first_on_path(tools):
    old, new, _ = tools
    assert cc.tool_candidates("ptxas")[0] == old  # PATH is searched first...
    assert cc.find_tool("ptxas") == new  # ...but the newest wins


def test_ties_and_unreadable_releases_keep_search_order(tmp_path, monkeypatch):
    a = _fake(tmp_path / "a" / "ptxas", "13.0")
    b = _fake(tmp_path / "b" / "ptxas", "13.0")
    c = tmp_path / "c" / "ptxas"
    c.parent.mkdir()
    c.write_text("#!/bin/sh\necho nothing\n")
    c.chmod(0o755)
    monkeypatch.setattr(cc, "tool_candidates", lambda name: [a, b])
    cc.tool_release.cache_clear()
    assert cc.find_tool("ptxas") == a
    monkeypatch.setattr(cc, "tool_candidates", lambda name: [str(c)])
    assert cc.find_tool("ptxas") == str(c) and cc.tool_release(str(c)) is None
    monkeypatch.setattr(cc, "tool_candidates", lambda name: [])
    assert cc.find_tool("ptxas") is None


def test_real_candidates_search_path_first(tmp_path, monkeypatch):
    sysbin = tmp_path / "sysbin"
    tool = _fake(sysbin / "nvfaketool", "13.0")
    monkeypatch.setenv("PATH", f"{sysbin}{os.pathsep}{os.environ.get('PATH', '')}")
    assert cc.tool_candidates("nvfaketool")[0] == tool


def test_a_ptxas_older_than_the_ptx_is_reported_as_the_environment(tools, monkeypatch):
    old, new, _ = tools
    monkeypatch.setattr(cc, "find_tool", lambda name: old)  # as if only the old one were usable
    ptx = "//\n.version 9.4\n.target sm_90a\n.address_size 64\n"
    with pytest.raises(RuntimeError) as err:
        cc.ptxas_verbose(ptx)
    msg = str(err.value)
    assert msg.startswith("environment: the CuTe DSL emitted PTX ISA 9.4, newer than every ptxas found")
    assert f"{old} (CUDA 13.0)" in msg and f"{new} (CUDA 13.4)" in msg and "Unsupported .version 9.4" in msg


def test_other_ptxas_failures_stay_plain(tools, tmp_path, monkeypatch):
    bad = _fake(tmp_path / "bad" / "ptxas", "13.4", fail="ptxas error: syntax error")
    monkeypatch.setattr(cc, "find_tool", lambda name: bad)
    with pytest.raises(RuntimeError, match=r"^ptxas failed \(.*\):\n.*syntax error"):
        cc.ptxas_verbose(".version 9.0\n")


def test_ops_between_waits_counts_the_work_under_the_last_gemm_group():
    """Only what lies between a wait on 1 group and the next wait on 0 counts; a wait on 1 that is
    followed by another wait on 1 (or by nothing) starts over; predicated lines are read too."""
    sass = "\n".join(f"        /*{i * 16:04x}*/                   {op} ;" for i, op in enumerate([
        "HGMMA.64x64x16.F32.BF16 R152, gdesc[UR20], R152, gsb0",
        "MUFU.EX2 R1, R1",  # before any wait: not counted
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "MUFU.EX2 R2, R2",
        "@!P0 MUFU.EX2 R3, R3",
        "FFMA R4, R4, R5, R6",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "MUFU.EX2 R7, R7",  # after the second wait: not counted
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "MUFU.EX2 R8, R8",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",  # starts over
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "MUFU.EX2 R9, R9",  # never closed by a wait on 0
    ]))
    assert cc.ops_between_waits(sass, "MUFU.EX2") == [2, 0]
    assert cc.ops_between_waits(sass, "FFMA") == [1, 0]
