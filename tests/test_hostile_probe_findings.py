"""What benchmarks/hostile_probes.py found on its first rerun of issue 26's probes, each fixed here: a config
field that is null (a huggingface_hub validation traceback), calibrate --export making a missing folder, an IPv6
URL not closed (a ValueError traceback), an exception's class name in the Prometheus and snapshot messages, a
recording of another version or with a negative reading taken, -o a named pipe nobody reads (blocked for ever)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

import engine.cuda.gpu_profile as gp
from engine.core.errors import UserError
from engine.monitor.promapi import PromClient
from engine.monitor.recording import load_recording
from engine.sketch.document import load_template
from engine.snapshots.file import load_snapshot_file
from main import main

DATA = Path(__file__).parent / "data"
EXCEPTION_NAME = ("Error:", "Exception:", "Error)", "HTTPException")


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings"])
def test_a_null_config_field_is_one_line_naming_it(tmp_path, capsys, key):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128,
           key: None}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    err = _one_line(capsys, ["estimate", str(p), "--seq-len", "16"])
    assert "transformers rejects the config" in err and f"'{key}'" in err
    assert not any(n in err for n in EXCEPTION_NAME)


def test_calibrate_export_refuses_a_missing_folder_and_makes_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "data"))
    gp.reload_profiles()
    target = tmp_path / "missing" / "deeper" / "h200.json"
    err = _one_line(capsys, ["calibrate", "--export", "H200", str(target)])
    assert "does not exist" in err and not (tmp_path / "missing").exists()
    assert main(["calibrate", "--export", "H200", str(tmp_path / "h200.json")]) == 0  # a folder that is there


def test_a_broken_profile_names_what_is_wrong_without_the_exception_class(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "data"))
    gp.reload_profiles()
    real = json.loads((Path(gp.builtin_dir()) / "nvidia-h200.json").read_text())
    p = tmp_path / "p.json"
    p.write_text(json.dumps(dict(real, cublas_workspaces=None)))
    err = _one_line(capsys, ["calibrate", "--import", str(p)])
    assert "broken GPU profile: a field has the wrong type" in err and "TypeError" not in err


def test_an_ipv6_url_not_closed_is_one_line():
    with pytest.raises(UserError, match=r"needs its closing '\]'"):
        PromClient("http://[::1")


def _serve_once(answer: bytes) -> str:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(answer)
        conn.close()
        srv.close()
    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


def test_a_malformed_http_answer_is_named_without_the_exception_class(capsys):
    url = _serve_once(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n{}")
    assert main(["monitor", "--prometheus", url, "--once", "--timeout", "5"]) == 1
    out = capsys.readouterr().out
    assert "not a valid HTTP answer (got more than 100 headers)" in out
    assert not any(n in out for n in EXCEPTION_NAME)


def _recording(tmp_path: Path, header: dict[str, object], **gpu: object) -> Path:
    lines = (DATA / "h200-monitor-excerpt.jsonl").read_text().splitlines()
    sample = json.loads(lines[1])
    sample["gpus"] = [dict(sample["gpus"][0], **gpu)]
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(header) + "\n" + json.dumps(sample) + "\n")
    return p


def test_a_recording_of_another_version_is_refused(tmp_path):
    with pytest.raises(UserError, match="a recording of version 99; this VRAMScope reads version 1"):
        load_recording(_recording(tmp_path, {"format": "vramscope-monitor", "version": 99}))
    assert load_recording(_recording(tmp_path, {"format": "vramscope-monitor", "version": 1}))


@pytest.mark.parametrize("key", ["memory_used", "index", "power_mw", "temperature_c"])
def test_a_negative_recorded_reading_is_refused(tmp_path, key):
    with pytest.raises(UserError, match=f"'{key}' is -1, not a whole number of 0 or more"):
        load_recording(_recording(tmp_path, {"format": "vramscope-monitor", "version": 1}, **{key: -1}))


def test_the_snapshot_readers_messages_name_no_exception_class(tmp_path):
    for name, data in (("e.pickle", b""), ("t.pickle", b"hello"), ("g.pickle.gz", b"\x1f\x8b\x08\x00")):
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(UserError) as e:
            load_snapshot_file(p)
        assert not any(n in str(e.value) for n in ("EOFError", "UnpicklingError", "BadGzipFile")), str(e.value)


@pytest.mark.skipif(os.name != "posix", reason="named pipes are POSIX")
def test_output_to_a_named_pipe_nobody_reads_is_one_line_not_a_hang(tmp_path, capsys):
    sketch = tmp_path / "tiny.json"
    load_template("mlp").save(sketch)
    pipe = tmp_path / "out.json"
    os.mkfifo(pipe)
    t0 = time.monotonic()
    err = _one_line(capsys, ["estimate", str(sketch), "--device", "cpu", "-o", str(pipe)])
    assert "no program is reading this named pipe; start its reader first" in err
    assert time.monotonic() - t0 < 60
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    time.sleep(0.2)  # the reader has the pipe open: the estimate is written into it whole
    assert main(["estimate", str(sketch), "--device", "cpu", "-o", str(pipe)]) == 0
    reader.join(30)
    assert json.loads(got[0])["model_name"]


def test_a_negative_prometheus_reading_is_unknown_and_the_recording_replays(tmp_path):
    # a replay refuses a negative reading (above); the live reader must not record one
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from engine.monitor.prometheus import OK, PrometheusSource
    from engine.monitor.recording import save_recording

    series = [{"metric": {"__name__": name, "Hostname": "node1", "gpu": "0", "modelName": "NVIDIA H200"},
               "value": [time.time(), value]}
              for name, value in (("DCGM_FI_DEV_FB_USED", "-5"), ("DCGM_FI_DEV_FB_FREE", "1000"),
                                  ("DCGM_FI_DEV_GPU_TEMP", "-40"), ("DCGM_FI_DEV_GPU_UTIL", "50"))]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name; the client posts its queries
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        snap = PrometheusSource(PromClient(f"http://127.0.0.1:{httpd.server_address[1]}")).sample()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert snap.state == OK and len(snap.gpus) == 1, snap.message
    g = snap.gpus[0]
    assert g.memory_used is None and g.temperature_c is None and g.util_gpu == 50
    replayed = load_recording(save_recording(tmp_path / "fleet.jsonl", [snap]))
    assert replayed[0].gpus[0].memory_used is None and replayed[0].gpus[0].util_gpu == 50
