"""Issue 12: output files. `-o` writes through a symbolic link, writes a device or a pipe directly (never
replaces it), gives new files the umask's mode, and temp files a kill -9 left behind are cleaned up."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

import main as entry
from engine.core.atomic_write import STALE_S, clean_stale_temps, replace_atomically

FIX = Path(__file__).resolve().parent / "fixtures"
TINY = f"{FIX / 'cli_models.py'}:tiny"


def estimate_to(capsys, target) -> int:
    rc = entry.main(["estimate", TINY, "--device", "cpu", "-o", str(target)])
    capsys.readouterr()
    return rc


def test_output_through_a_symlink_writes_the_target(tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert estimate_to(capsys, link) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["peak_bytes"] > 0


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    replace_atomically(link, "{}")
    assert link.is_symlink() and (tmp_path / "new.json").read_text() == "{}"


def test_output_to_dev_null_writes_it_and_keeps_the_device(capsys):
    before = os.stat("/dev/null")
    assert estimate_to(capsys, "/dev/null") == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_output_to_a_named_pipe_is_written_directly(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = {}

    def reader():
        with open(fifo, "rb") as f:
            got["data"] = f.read()

    t = threading.Thread(target=reader)
    t.start()
    assert estimate_to(capsys, fifo) == 0
    t.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and json.loads(got["data"])["peak_bytes"] > 0


@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_new_files_respect_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        p = replace_atomically(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(p).st_mode) == mode


def test_existing_files_keep_their_mode(tmp_path):
    p = tmp_path / "kept.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    replace_atomically(p, "new")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640 and p.read_text() == "new"


def test_stale_temp_files_of_ours_are_cleaned_and_nothing_else(tmp_path):
    old = time.time() - STALE_S - 60
    stale = [tmp_path / ".r.json.ab12cd34.tmp", tmp_path / ".r.json.x_9kq2mz.tmp"]
    fresh = tmp_path / ".r.json.00ff00ff.tmp"
    others = [tmp_path / ".r.json.tmp", tmp_path / ".other.json.ab12cd34.tmp", tmp_path / "r.json.ab12cd34.tmp",
              tmp_path / ".r.json.ab12cd345.tmp"]
    for p in [*stale, fresh, *others]:
        p.write_text("x")
        if p is not fresh:
            os.utime(p, (old, old))
    replace_atomically(tmp_path / "r.json", "{}")
    assert not any(p.exists() for p in stale)
    assert fresh.exists() and all(p.exists() for p in others)
    assert clean_stale_temps(tmp_path, "r.json", now=time.time() + STALE_S + 60) == [fresh]
