"""The test run's user folders (tests/conftest.py): `make test` runs the suite in several pytest-xdist workers at
once, so the app's settings, its autosave folder and the calibration data folder are each test process's own,
never the user's (their settings and profiles must not change what the tests see) nor another worker's."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QSettings

from engine.gpu_profile import user_data_dir
from gui.builder.document import default_autosave_dir

ROOT = Path(__file__).resolve().parents[1]


def _own_folder() -> Path:
    home = Path.home()
    assert home.name == "home" and home.parent.name.startswith("vramscope-test-home-")
    return home.parent


def test_settings_autosave_and_data_folders_are_this_test_processes_own(qapp):
    own = _own_folder()
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert not own.is_relative_to(real_home)
    for path in (Path(QSettings().fileName()), default_autosave_dir(), user_data_dir()):
        assert path.is_relative_to(own), path
    # …and a subprocess a test starts (the app, the CLI) inherits them.
    out = subprocess.run([sys.executable, "-c", "import pathlib; print(pathlib.Path.home())"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert Path(out) == Path.home()


def test_two_test_processes_get_folders_of_their_own():
    # Each xdist worker imports tests/conftest.py afresh: two imports in two interpreters, two different homes.
    probe = "import tests.conftest, pathlib; print(pathlib.Path.home())"
    homes = {subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=True, env={k: v for k, v in os.environ.items()
                                             if k not in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                                                          "XDG_STATE_HOME", "VRAMSCOPE_DATA_DIR")}
                            ).stdout.strip() for _ in range(2)}
    assert len(homes) == 2 and Path.home() not in {Path(h) for h in homes}
    assert not any(Path(h).exists() for h in homes)  # each removed its folder when it ended


def test_prometheus_takes_another_port_when_its_free_port_was_taken_meanwhile(tmp_path, monkeypatch):
    # free_port() lets its port go before Prometheus binds it; under xdist another worker may take it first.
    import pytest

    from tests import promserver

    binary = promserver.find_prometheus()
    if binary is None:
        pytest.skip("Prometheus is not installed (make test installs Debian's package where it may)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([int(taken.getsockname()[1]), promserver.free_port()])
        monkeypatch.setattr(promserver, "free_port", lambda: next(ports))
        server = promserver.PrometheusServer(binary, tmp_path, {"none": []})
        try:
            assert server.port != taken.getsockname()[1]
            assert "address already in use" not in (tmp_path / "prometheus.log").read_text()
            assert server.series("up") == []
        finally:
            server.close()
