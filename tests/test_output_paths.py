"""Output paths a clumsy user gives: two outputs that are one file, file names at and past the system's limit.
Each is refused in one line before any work (exit 2), or written whole."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from engine.core.atomic_write import NAME_MAX, clean_stale_temps, replace_atomically
from main import main

SKETCH = str(Path(__file__).parent.parent / "resources" / "templates" / "mlp.json")


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("pair", [("-o", "--html"), ("--html", "--json"), ("-o", "--json")])
def test_two_outputs_naming_one_file_are_refused(tmp_path, capsys, pair):
    target = tmp_path / "x.pdf"
    target.write_bytes(b"%PDF-1.4 the report of yesterday")
    argv = ["report", SKETCH, "--no-plan"]
    for opt in pair:
        argv += [opt, str(target)]
    if "-o" not in pair:
        argv += ["-o", str(tmp_path / "r.pdf")]
    err = _one_line_exit_2(capsys, argv)
    assert f"{pair[0]} and {pair[1]} name one file" in err
    assert target.read_bytes() == b"%PDF-1.4 the report of yesterday"  # refused before anything was written


def test_an_output_through_a_link_to_another_output_is_refused(tmp_path, capsys):
    html = tmp_path / "page.html"
    link = tmp_path / "report.pdf"
    link.symlink_to(html)  # dangling until the report would write it
    err = _one_line_exit_2(capsys, ["report", SKETCH, "--no-plan", "-o", str(link), "--html", str(html)])
    assert "-o and --html name one file" in err
    folder_link = tmp_path / "same"
    folder_link.symlink_to(tmp_path)
    err = _one_line_exit_2(capsys, ["report", SKETCH, "--no-plan", "-o", str(tmp_path / "a.pdf"),
                                    "--json", str(folder_link / "a.pdf")])
    assert "-o and --json name one file" in err
    hard = tmp_path / "hard.json"
    (tmp_path / "orig.json").write_text("{}")
    os.link(tmp_path / "orig.json", hard)
    err = _one_line_exit_2(capsys, ["report", SKETCH, "--no-plan", "-o", str(tmp_path / "b.pdf"),
                                    "--html", str(tmp_path / "orig.json"), "--json", str(hard)])
    assert "--html and --json name one file" in err


@pytest.mark.parametrize("argv", [["report", SKETCH, "--no-plan", "-o"], ["estimate", SKETCH, "-o"],
                                  ["report", SKETCH, "--no-plan", "-o", "{tmp}/r.pdf", "--json"]])
def test_a_file_name_past_255_bytes_is_one_line(tmp_path, capsys, argv):
    name = "a" * (NAME_MAX + 1 - 4) + ".pdf"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + [str(tmp_path / name)]
    err = _one_line_exit_2(capsys, argv)
    assert "its name is 256 bytes, more than a file name holds (255)" in err


@pytest.mark.parametrize("name", ["b" * 246 + ".pdf", "é" * 125 + ".pdf", "c" * 255])
def test_a_legal_long_name_is_written_and_its_temp_file_fits(tmp_path, name):
    assert len(name.encode()) <= NAME_MAX
    target = tmp_path / name
    replace_atomically(target, b"whole")
    assert target.read_bytes() == b"whole" and os.listdir(tmp_path) == [name]  # no temp file left
    if name.isascii():
        # a temp file a killed save of it left behind (its name cut to fit) is still ours, and cleaned when stale
        stale = tmp_path / f".{name[:NAME_MAX - 14]}.deadbeef.tmp"
        stale.write_bytes(b"x")
        old = time.time() - 3600
        os.utime(stale, (old, old))
        assert clean_stale_temps(tmp_path, name) == [stale]


def test_a_250_byte_report_name_is_written(tmp_path, capsys):
    name = "r" * 246 + ".pdf"
    assert main(["report", SKETCH, "--no-plan", "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes().startswith(b"%PDF") and os.listdir(tmp_path) == [name]


def test_a_report_not_named_pdf_and_a_dash_for_a_file_are_one_line(tmp_path, capsys):
    """`report -o x.txt` wrote a PDF under a .txt name, silently; `-o -` wrote a file named '-'."""
    err = _one_line_exit_2(capsys, ["report", SKETCH, "--no-plan", "-o", str(tmp_path / "x.txt")])
    assert "does not end in .pdf" in err and not (tmp_path / "x.txt").exists()
    for argv in (["report", SKETCH, "--no-plan", "-o", "-"], ["estimate", SKETCH, "-o", "-"]):
        err = _one_line_exit_2(capsys, argv)
        assert "'-' would write a file named '-'" in err
    assert not Path("-").exists()
    out = tmp_path / "through.pdf"  # a pipe or device is written as it is, whatever its name
    os.mkfifo(tmp_path / "pipe")
    reader = subprocess.Popen(["sh", "-c", f"cat '{tmp_path / 'pipe'}' > '{out}'"])
    assert main(["report", SKETCH, "--no-plan", "-o", str(tmp_path / "pipe")]) == 0
    reader.wait(timeout=60)
    assert out.read_bytes().startswith(b"%PDF")
