"""The one NVML gateway (engine.core.nvml): started once for all its users and shut down after the last, every query
answering a value or a default instead of raising, and the only module that imports pynvml."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from engine.config import gpus
from engine.core import nvml
from tests.fake_nvml import E, FakeGpu, FakeNvml, three_gpus

ROOT = Path(__file__).resolve().parent.parent
# the project's Python: the product's packages, the benchmarks and the tests
SOURCES = ("main.py", "engine", "cli", "gui", "render", "report", "vramscope", "benchmarks", "tests")
# the gateway, and the tests' stand-in for the binding (it raises pynvml's own error classes)
MAY_IMPORT_PYNVML = {"engine/core/nvml.py", "tests/fake_nvml.py"}


def _imports_pynvml(tree: ast.AST) -> list[int]:
    """Lines that import pynvml: `import pynvml`, `from pynvml import …`, importlib.import_module("pynvml")."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pynvml" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pynvml":
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "pynvml":
            lines.append(node.lineno)
    return lines


def test_only_the_gateway_imports_pynvml():
    found = []
    for top in SOURCES:
        paths = [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py"))
        for path in paths:
            rel = path.relative_to(ROOT).as_posix()
            lines = _imports_pynvml(ast.parse(path.read_text(encoding="utf-8"), rel))
            if lines and rel not in MAY_IMPORT_PYNVML:
                found.append(f"{rel}:{lines}")
    assert found == [], "pynvml imported outside engine/core/nvml.py (go through the gateway): " + ", ".join(found)


def test_the_import_check_sees_each_way_of_importing():
    code = "import pynvml\nfrom pynvml import nvmlInit\nimport importlib\nm = importlib.import_module('pynvml')\n"
    assert _imports_pynvml(ast.parse(code)) == [1, 2, 4]
    assert _imports_pynvml(ast.parse("from engine import nvml\nnvml.query('nvmlDeviceGetCount')\n")) == []


def test_started_once_for_all_users_and_shut_down_after_the_last():
    fake = FakeNvml(three_gpus())
    gateway = nvml.Nvml(fake)
    with gateway.session() as first:
        with gateway.session() as second:
            assert first is None and second is None and gateway.users == 2
            assert gateway.query("nvmlDeviceGetCount") == 3
        assert fake.shutdowns == 0 and gateway.query("nvmlDeviceGetCount") == 3  # the first user still holds it
    assert (fake.inits, fake.shutdowns, gateway.users) == (1, 1, 0)
    gateway.stop()  # one stop too many is harmless
    assert fake.shutdowns == 1
    with gateway.session():
        pass
    assert (fake.inits, fake.shutdowns) == (2, 2)  # started again for a new user


def test_users_on_several_threads_start_it_once():
    fake = FakeNvml(three_gpus())
    gateway = nvml.Nvml(fake)
    barrier = threading.Barrier(8)

    def user() -> None:
        barrier.wait()
        assert gateway.start() is None

    threads = [threading.Thread(target=user) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (fake.inits, gateway.users) == (1, 8)
    for _ in range(8):
        gateway.stop()
    assert (fake.shutdowns, gateway.users) == (1, 0)


def test_a_failed_start_says_why_and_holds_nothing():
    fake = FakeNvml([], library_missing=True)
    gateway = nvml.Nvml(fake)
    with gateway.session() as failure:
        assert failure == "NVIDIA driver not installed (the NVML library libnvidia-ml was not found)"
        assert gateway.query("nvmlDeviceGetCount", default=-1) == -1  # not started: the default
    assert (gateway.users, fake.shutdowns) == (0, 0)


@pytest.mark.parametrize(("raised", "reason", "code"), [
    (E.NVMLError_NotSupported(), "not supported by this GPU", "NVMLError_NotSupported"),
    (E.NVMLError_NoPermission(), "permission denied", "NVMLError_NoPermission"),
    (E.NVMLError_GpuIsLost(), "GPU is lost (fell off the bus); waiting for it to come back", "NVMLError_GpuIsLost"),
    (E.NVMLError_DriverNotLoaded(), "the NVIDIA driver is installed but not loaded (no GPU detected, or the kernel "
                                    "module is missing)", "NVMLError_DriverNotLoaded"),
    (OSError(5, "Input/output error"), "OSError: [Errno 5] Input/output error", "OSError"),
    (MemoryError(), "MemoryError", "MemoryError"),
])
def test_every_query_answers_a_default_instead_of_raising(raised, reason, code):
    fake = FakeNvml(three_gpus())

    def fails(*args):
        raise raised

    fake.nvmlDeviceGetPowerUsage = fails
    gateway = nvml.Nvml(fake)
    with gateway.session():
        h = gateway.query("nvmlDeviceGetHandleByIndex", 0)
        answer = gateway.ask("nvmlDeviceGetPowerUsage", h)
        assert isinstance(answer, nvml.NotAvailable) and not answer
        assert (answer.reason, answer.code) == (reason, code)
        assert gateway.query("nvmlDeviceGetPowerUsage", h) is None
        assert gateway.query("nvmlDeviceGetPowerUsage", h, default="N/A") == "N/A"
        assert gateway.query("nvmlDeviceGetEnforcedPowerLimit", h) == 400_000  # the next query answers
        missing = gateway.ask("nvmlDeviceGetSomethingFromTheFuture", h)
        assert (missing.reason, missing.code) == ("not in this driver version", "NVMLError_FunctionNotFound")


def test_the_local_gpu_is_read_through_the_gateway(fake_nvml):
    fake_nvml.gpus = [FakeGpu("NVIDIA H200", 143771, 700), FakeGpu("NVIDIA A100-SXM4-80GB", 81920, 400)]
    assert gpus.local_gpu_names() == ("NVIDIA H200", "NVIDIA A100-SXM4-80GB")
    assert gpus.local_gpu(0) == gpus.find_gpu("H200") and gpus.local_gpu(1) == gpus.find_gpu("A100 80GB")
    assert gpus.local_gpu(2) is None
    assert (fake_nvml.inits, fake_nvml.shutdowns) == (1, 1)  # asked once


def test_a_gpu_nvml_cannot_name_is_no_catalogue_gpu(fake_nvml):
    fake_nvml.gpus = [FakeGpu("NVIDIA H200", 143771, 700, denied={"nvmlDeviceGetName"}),
                      FakeGpu("NVIDIA A100-SXM4-80GB", 81920, 400)]
    assert gpus.local_gpu_names() == ("", "NVIDIA A100-SXM4-80GB")
    assert gpus.local_gpu(0) is None and gpus.local_gpu(1) == gpus.find_gpu("A100 80GB")


def test_no_driver_no_local_gpu(fake_nvml):
    fake_nvml.library_missing = True
    assert gpus.local_gpu_names() == () and gpus.local_gpu(0) is None
