"""`monitor` options that only one of its modes reads are refused in one line elsewhere (issue 26: options silently
ignored), as `--replay` without `--serve-metrics` already was."""

from __future__ import annotations

import pytest

from main import main


@pytest.mark.parametrize("argv, words", [
    (["monitor", "--once", "--hostname", "gpu-node-1"], "--hostname NAME labels what --serve-metrics serves"),
    (["monitor", "--once", "--timeout", "3"], "--timeout S bounds a Prometheus query; add --prometheus URL"),
    (["monitor", "--serve-metrics", "127.0.0.1:0", "--timeout", "3", "--duration", "0.2"],
     "--timeout S bounds a Prometheus query"),
    (["monitor", "--prometheus", "http://127.0.0.1:9", "--once", "--hostname", "x"], "--hostname NAME labels"),
])
def test_an_option_of_another_mode_is_one_line_exit_2(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
