"""Start-up imports what a command needs, when it needs it: the CLI's parser loads no torch, an estimate of a
template loads no transformers, peft or bitsandbytes, and nothing headless loads Qt or pyqtgraph (issue 24).
Each check runs in a fresh interpreter, so what this test process has imported does not count."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "PySide6", "pyqtgraph")
PROBE = "import json, sys\n{code}\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))"


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code, heavy=HEAVY)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cli_and_its_parser_load_no_torch_qt_or_hugging_face():
    code = "import cli, main\nmain._build_parser().parse_args(['estimate', 'gpt2'])"
    assert _loaded(code) == []


def test_version_loads_nothing_heavy():
    code = "import main\ntry:\n    main.main(['--version'])\nexcept SystemExit:\n    pass"
    assert _loaded(code) == []


def test_estimating_a_template_loads_torch_but_no_hugging_face_libraries_or_qt():
    code = "import contextlib, io, main\nwith contextlib.redirect_stdout(io.StringIO()):\n" \
           "    assert main.main(['estimate', 'lstm-lm', '--seq-len', '8', '--device', 'cpu']) == 0"
    assert _loaded(code) == ["torch"]

