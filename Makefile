# Two commands on a fresh machine: `make run` and `make test`. Both set up .venv when it is missing.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of torch first when none is present, so an unpinned resolver never pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: run test bench setup package package-smoke clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_PIN)"
	$(VPY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# Qt's xcb libraries are checked (and installed where this user may) before the minutes-long venv setup.
run:
	@$(PY) packaging/qt_system_libs.py
	@$(MAKE) --no-print-directory setup
	$(VPY) main.py

# The fleet tests run a real Prometheus (Debian's package): installed quietly when missing where this user may
# (root with apt-get); elsewhere those tests skip and say why. The suite runs on every core (pytest-xdist;
# TEST_WORKERS=0 runs it in this one process); each worker has user folders of its own (tests/conftest.py).
TEST_WORKERS ?= auto
test: $(STAMP)
	$(VPY) -m ruff check .
	$(VPY) -m mypy
	@$(VPY) -m tests.promserver
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -n $(TEST_WORKERS)

bench: $(STAMP)
	$(VPY) -m benchmarks.zoo

package: $(STAMP)
	$(VPY) -m pip install -q -e ".[package]"
	bash packaging/build.sh

clean:
	rm -rf build dist $(VENV)

package-smoke:
	bash packaging/smoke.sh
