"""`make run`'s check of the system libraries Qt's xcb plugin loads (packaging/qt_system_libs.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packaging"))
import qt_system_libs as q

LISTING_HEAD = "1234 libs found in cache `/etc/ld.so.cache'\n"


def _listing(sonames) -> str:
    return LISTING_HEAD + "".join(f"\t{s} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{s}\n" for s in sonames)


def test_only_linux_with_the_xcb_platform_is_checked():
    assert q.needs_check("linux", {})
    assert q.needs_check("linux", {"QT_QPA_PLATFORM": "xcb"})
    assert not q.needs_check("linux", {"QT_QPA_PLATFORM": "offscreen"})
    assert not q.needs_check("linux", {"QT_QPA_PLATFORM": "wayland"})
    assert not q.needs_check("darwin", {})
    assert not q.needs_check("win32", {})


def test_the_three_libraries_the_new_user_met_are_named_together():
    three = ("libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1")
    have = [s for s, _ in q.REQUIRED if s not in three]
    assert q.missing_packages(_listing(have)) == ["libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"]
    assert q.missing_packages(_listing([s for s, _ in q.REQUIRED])) == []


def test_without_apt_rights_it_prints_the_one_command_and_stops(monkeypatch, capsys):
    three = ("libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1")
    monkeypatch.setattr(q, "_ldconfig_listing", lambda: _listing([s for s, _ in q.REQUIRED if s not in three]))
    monkeypatch.setattr(q, "_install_prefix", lambda: None)
    monkeypatch.setattr(q.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(q.sys, "platform", "linux")
    assert q.main() == 1
    err = capsys.readouterr().err
    commands = [line.strip() for line in err.splitlines() if "apt-get install" in line]
    assert len(commands) == 1 and commands[0] == "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1"


def test_as_root_it_installs_them_with_apt(monkeypatch):
    calls = []
    monkeypatch.setattr(q, "_ldconfig_listing", lambda: _listing([s for s, _ in q.REQUIRED[1:]]))
    monkeypatch.setattr(q, "_install_prefix", list)
    monkeypatch.setattr(q.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(q.sys, "platform", "linux")
    assert q.main() == 0
    assert calls == [["apt-get", "install", "-y", "--no-install-recommends", "libxcb1"]]


def test_make_run_checks_before_it_sets_up_the_venv():
    run = re.search(r"^run:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.DOTALL | re.MULTILINE).group(0)
    assert run.index("qt_system_libs.py") < run.index("setup") < run.index("main.py")
    assert "$(STAMP)" not in run.splitlines()[0]  # the venv is not a prerequisite that make would build first


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None, reason="ELF only")
def test_the_list_covers_what_the_installed_xcb_plugin_needs():
    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    needed = set()
    for lib in (qt / "plugins/platforms/libqxcb.so", qt / "lib/libQt6XcbQpa.so.6", qt / "lib/libQt6Gui.so.6"):
        out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        needed |= set(re.findall(r"NEEDED.*\[(.+?)\]", out))
    with_python = re.compile(r"^(libQt6|libicu|libc\.|libm\.|libstdc\+\+|libgcc_s|ld-linux|libz\.|libzstd\.)")
    assert {n for n in needed if not with_python.match(n)} <= {s for s, _ in q.REQUIRED}
