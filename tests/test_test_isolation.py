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

from engine.cuda.gpu_profile import user_data_dir
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


def _child_folders(env: dict[str, str]) -> tuple[Path, Path]:
    """(home, data folder) of a test process started with `env`, as an xdist worker imports tests/conftest.py."""
    probe = "import os, pathlib, tests.conftest; print(pathlib.Path.home()); print(os.environ['VRAMSCOPE_DATA_DIR'])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    return Path(out[0]), Path(out[1])


def test_workers_started_from_a_test_process_get_folders_of_their_own(tmp_path):
    # xdist's controller imports tests/conftest.py too, and its workers inherit its environment: this process
    # plays the controller. Each worker's folders are its own, and removed when it ends.
    env = {**os.environ, "VRAMSCOPE_DATA_DIR": str(_own_folder() / "vramscope-data")}
    a, b = _child_folders(env), _child_folders(env)
    assert len({a[0], b[0], Path.home()}) == 3
    assert len({a[1], b[1], user_data_dir()}) == 3
    assert a[1].parent == a[0].parent and not a[0].parent.exists() and not b[0].parent.exists()
    # A data folder given by whoever runs the tests is kept.
    given = tmp_path / "my-profiles"
    assert _child_folders({**env, "VRAMSCOPE_DATA_DIR": str(given)})[1] == given


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


def test_an_xdist_worker_runs_torch_on_one_thread():
    # -n auto starts a worker per core; more threads per worker only spin against each other.
    import pytest
    import torch

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not an xdist worker: torch keeps its own thread count")
    assert torch.get_num_threads() == 1
