"""The probes of issue 26, rerun: hostile and malformed input on the newer surface, generated in hundreds.

    python -m benchmarks.hostile_probes [--only CLASS ...] [--markdown] [--show weak,failed]

Each probe runs the project's own entry point in this process (`main.main(argv)`, or the reader the app calls),
under a time bound (SIGALRM) and an address-space ceiling, in a scratch folder with its own data folder. Classes:
`open` memory snapshots, Hugging Face config.json, LoRA / quantization options, `calibrate --import/--export/
--list`, `monitor --prometheus` against bad servers, exporter replays, output paths, the app's own files.

A probe is
  failed: a traceback (an exception out of the entry point), past its time bound, exit 0 on bad input, more than
          1 GiB of new peak memory, or a credential seen by another origin;
  weak:   refused, but not in one line (several lines, over 400 characters, an exception's class name in it), or
          a refusal slower than 10 s;
  good:   otherwise (bad input refused in one line, exit 2 or the monitor's exit 1 with its state; good input
          taken).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pickle
import resource
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.hostile_probe_kit import DATA, GIB, ODD, ROOT, Outcome, Probe, Scratch, call, cli, judge
from benchmarks.hostile_probes_net import exporter_probes, prometheus_probes

# ---------------------------------------------------------------------------------------------------------------
# open: memory snapshots

def snapshot_probes(s: Scratch) -> Iterator[Probe]:
    base = pickle.loads(gzip.decompress((DATA / "resnet50-b256-oom-at-4gib.pickle.gz").read_bytes()))
    trace = base["device_traces"][0]
    mid = len(trace) // 2
    entry_with_frames = next(i for i in range(mid, len(trace)) if trace[i].get("frames"))
    seg_with_blocks = next(i for i, seg in enumerate(base["segments"]) if seg.get("blocks"))
    places: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], tuple[str, ...]]] = {
        "trace entry": (lambda d: d["device_traces"][0][mid], ("action", "addr", "size", "stream", "time_us",
                                                             "frames")),
        "frame": (lambda d: d["device_traces"][0][entry_with_frames]["frames"][0], ("filename", "line", "name")),
        "segment": (lambda d: d["segments"][seg_with_blocks], ("address", "total_size", "stream", "segment_type",
                                                              "allocated_size", "active_size", "blocks")),
        "block": (lambda d: d["segments"][seg_with_blocks]["blocks"][0], ("size", "requested_size", "address",
                                                                         "state", "frames")),
    }
    for place, (get, keys) in places.items():
        for key in keys:
            for label, value in ODD:
                d = pickle.loads(pickle.dumps(base))
                get(d)[key] = value
                p = s.write("snap.pickle", pickle.dumps(d))
                # -1 or 2**63 where a stream or a time goes may be taken; a string where a number goes never
                either = (label in ("-1", "2**63", "None", "a list") and key in ("stream", "time_us", "frames",
                                                                                  "line")
                          or label == "a string" and key in ("action", "filename", "name", "segment_type", "state"))
                yield Probe("snapshots", f"{place} '{key}' {label}", cli("open", str(p)), None if either else True)
    for key, value in (("segments", "x"), ("segments", None), ("device_traces", {"0": []}), ("device_traces", [5]),
                       ("allocator_settings", "x"), ("allocator_settings", {"PYTORCH_CUDA_ALLOC_CONF": 5}),
                       ("external_annotations", 5), ("external_annotations", [5])):
        d = pickle.loads(pickle.dumps(base))
        d[key] = value
        yield Probe("snapshots", f"top-level '{key}' = {value!r}", cli("open", str(s.write("s.pickle",
                                                                                          pickle.dumps(d)))),
                    None if key in ("external_annotations", "allocator_settings") else True)
    raw = pickle.dumps(base)
    gz = gzip.compress(raw)
    bad_crc = bytearray(gz)
    bad_crc[-8] ^= 0xFF

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {s.root / 'ran'}",))

    files: list[tuple[str, Path]] = [
        ("empty file", s.write("e.pickle", b"")), ("text file", s.write("t.pickle", "hello")),
        ("truncated gzip", s.write("t.pickle.gz", gz[: len(gz) // 2])), ("bad gzip CRC", s.write("c.pickle.gz",
                                                                                               bytes(bad_crc))),
        ("gzip of text", s.write("g.pickle.gz", gzip.compress(b"not a pickle"))),
        ("truncated pickle", s.write("tp.pickle", raw[: len(raw) // 2])),
        ("a global's reduce (os.system)", s.write("r.pickle", pickle.dumps({"segments": [Boom()]}))),
        ("builtins.eval", s.write("ev.pickle", b"cbuiltins\neval\n(S'1'\ntR.")),
        ("persistent id", s.write("pid.pickle", b"\x80\x02P1\n.")),
        ("LONG_BINPUT 2**28", s.write("m.pickle", b"\x80\x02}r" + struct.pack("<I", 1 << 28) + b".")),
        ("PUT 300000000", s.write("put.pickle", b"(dp300000000\n.")),
        ("10M MEMOIZE, gzip", s.write("m10.pickle.gz", gzip.compress(b"\x80\x04" + b"N\x94" * 10_000_000 + b".",
                                                                     9))),
        ("APPENDS of 300M Nones, gzip", s.write("ap.pickle.gz", gzip.compress(b"\x80\x02](" + b"N" * 300_000_000
                                                                            + b"e.", 9))),
        ("list nested 100,000 deep", s.write("deep.pickle", b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".")),
        ("a dict, no segments", s.write("nd.pickle", pickle.dumps({"a": 1}))),
        ("a list of ints", s.write("li.pickle", pickle.dumps([1, 2, 3]))),
        ("a FIFO", s.fifo("f.pickle")), ("a link to /dev/zero", s.zero("z.pickle.gz")),
        ("a folder", s.path("dir")), ("no such file", s.root / "missing.pickle"),
    ]
    files[-2][1].mkdir()
    for name, p in files:
        yield Probe("snapshots", name, cli("open", str(p)), True,
                    check=lambda rc, o, e: "a global's code ran" if (s.root / "ran").exists() else "")
    real = str(DATA / "resnet50-b256-oom-at-4gib.pickle.gz")
    for top in ("-1", "10**30", "x", "1e3"):
        yield Probe("snapshots", f"--top {top}", cli("open", real, "--top", top), True)
    yield Probe("snapshots", "a real snapshot", cli("open", real), False)


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face config.json

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-6}


def _config(s: Scratch, change: dict[str, Any] | None = None, text: str | None = None) -> Path:
    d = dict(TINY_LLAMA, **(change or {}))
    p = s.path("config.json")
    p.write_text(text if text is not None else json.dumps(d, allow_nan=True))
    return p


def hf_probes(s: Scratch) -> Iterator[Probe]:
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "num_hidden_layers", "vocab_size", "max_position_embeddings"):
        for label, value in [*ODD, ("0", 0), ("10**30", 10**30)]:
            if label in ("inf", "NaN"):
                value = {"inf": math.inf, "NaN": math.nan}[label]
            # None where transformers has a default (num_key_value_heads: as many as the heads) may be taken
            either = (key == "max_position_embeddings" and label in ("-1", "0", "2**63", "10**30")
                      or key == "num_key_value_heads" and label == "None")
            yield Probe("hf-config", f"'{key}' {label}", cli("estimate", str(_config(s, {key: value})),
                                                             "--seq-len", "16"), None if either else True,
                        bound_s=60)
    specials: list[tuple[str, dict[str, Any] | None, str | None, list[str], bool | None]] = [
        ("heads not dividing hidden", {"num_attention_heads": 5}, None, [], True),
        ("kv heads not dividing heads", {"num_key_value_heads": 3}, None, [], True),
        ("10,000 layers", {"num_hidden_layers": 10_000}, None, [], None),
        ("1,000,000 layers", {"num_hidden_layers": 1_000_000}, None, [], None),
        ("max_position -1 without --seq-len", {"max_position_embeddings": -1}, None, ["--no-seq"], True),
        ("no model_type", {"model_type": None}, None, [], True),
        ("unknown model_type", {"model_type": "evil-net"}, None, [], True),
        ("auto_map to code", {"auto_map": {"AutoModelForCausalLM": "evil.Model"}, "model_type": "evil"}, None, [],
         True),
        ("architectures of ints", {"architectures": [1, 2]}, None, [], None),
        ("torch_dtype nonsense", {"torch_dtype": "float99"}, None, [], None),
        ("a JSON list", None, "[1, 2]", [], True), ("deep nesting", None, "[" * 100_000 + "]" * 100_000, [], True),
        ("5000-digit number", None, '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}", [], True),
        ("binary", None, "\x00\xff\xfe" * 100, [], True), ("empty", None, "", [], True),
        ("the tiny llama", {}, None, [], False),
    ]
    for name, change, text, flags, bad in specials:
        p = _config(s, change, text)
        argv = ["estimate", str(p)] + ([] if "--no-seq" in flags else ["--seq-len", "16"])
        yield Probe("hf-config", name, cli(*argv), bad, bound_s=60)
    yield Probe("hf-config", "a FIFO named config.json", cli("estimate", str(s.fifo("config.json"))), True)
    yield Probe("hf-config", "config.json links to /dev/zero", cli("estimate", str(s.zero("config.json"))), True)


# ---------------------------------------------------------------------------------------------------------------
# LoRA / quantization options

def lora_probes(s: Scratch) -> Iterator[Probe]:
    cfg = str(_config(s))
    base = ["estimate", cfg, "--seq-len", "16"]
    for rank in ("0", "-1", str(2**62), str(10**30), "abc", "1.5", "", " 8", "nan", "٣"):
        either = rank in (" 8", "٣")  # int() reads both as a rank (8, 3)
        yield Probe("lora", f"--lora-rank {rank!r}", cli(*base, "--peft", "lora", "--lora-rank", rank),
                    None if either else True, bound_s=60)
    for alpha in ("0", "-1", str(2**62), "x", "1e400"):
        yield Probe("lora", f"--lora-alpha {alpha!r}", cli(*base, "--peft", "lora", "--lora-alpha", alpha), True)
    for targets in (",,,", "", " ", "nonexistent", "q_proj\n", "*", ",q_proj,", "q_proj;v_proj", "\x1b[2J"):
        either = targets in ("q_proj\n", ",q_proj,")  # q_proj, once its blanks are dropped
        yield Probe("lora", f"--lora-targets {targets!r}", cli(*base, "--peft", "lora", "--lora-targets", targets),
                    None if either else True, bound_s=60)
    for peft in ("", "LORA", "lora ", "x", "qlora\n"):
        yield Probe("lora", f"--peft {peft!r}", cli(*base, "--peft", peft), True)
    for weights in ("int3", "", "NF4", "fp4 ", "float8\n"):
        yield Probe("lora", f"--weights {weights!r}", cli(*base, "--mode", "inference", "--weights", weights), True)
    yield Probe("lora", "--lora-targets without --peft", cli(*base, "--lora-targets", "q_proj"), True)
    yield Probe("lora", "--lora-rank without --peft", cli(*base, "--lora-rank", "8"), True)
    yield Probe("lora", "--lora-alpha without --peft", cli(*base, "--lora-alpha", "8"), True)
    yield Probe("lora", "--cache static in train mode", cli(*base, "--cache", "static"), True)
    yield Probe("lora", "--new-tokens 9 in inference mode", cli(*base, "--mode", "inference", "--new-tokens", "9"),
                True)
    yield Probe("lora", "--prompt-len 8 in train mode", cli(*base, "--prompt-len", "8"), True)
    yield Probe("lora", "lora on the tiny llama", cli(*base, "--peft", "lora", "--lora-rank", "4"), False,
                bound_s=120)
    yield Probe("lora", "qlora on the tiny llama", cli(*base, "--peft", "qlora"), None, bound_s=120)


# ---------------------------------------------------------------------------------------------------------------
# calibrate --import / --export / --list

def calibrate_probes(s: Scratch) -> Iterator[Probe]:
    real = json.loads((ROOT / "resources" / "gpu_profiles" / "nvidia-h200.json").read_text())
    real["gpu"] = dict(real["gpu"], name="Probe GPU")
    for key in ("version", "kind", "gpu", "software", "context_bytes", "context_inference_bytes",
                "cublas_workspaces", "cases", "kernels"):
        for label, value in ODD:
            d = dict(real)
            d[key] = value
            p = s.write("profile.json", json.dumps(d, allow_nan=True))
            yield Probe("calibrate", f"--import, '{key}' {label}", cli("calibrate", "--import", str(p)), None)
    huge = "9" * 5000
    texts = [("5000-digit context", json.dumps(real).replace(str(real["context_bytes"]), huge)),
             ("100k-deep nesting", "[" * 100_000 + "]" * 100_000), ("binary", "\x00\x01\xff" * 50),
             ("a 10k-character GPU name", json.dumps(dict(real, gpu=dict(real["gpu"], name="G" * 10_000)))),
             ("a GPU name with a newline", json.dumps(dict(real, gpu=dict(real["gpu"], name="A\nerror: forged")))),
             ("a GPU name with escapes", json.dumps(dict(real, gpu=dict(real["gpu"], name="A\x1b[2J")))),
             ("empty", ""), ("a list", "[]")]
    for name, text in texts:
        bad = None if "GPU name" in name else True
        yield Probe("calibrate", f"--import {name}", cli("calibrate", "--import", str(s.write("p.json", text))), bad,
                    check=lambda rc, o, e: "a control character printed" if "\x1b" in o + e else "")
    yield Probe("calibrate", "--import a gzip", cli("calibrate", "--import",
                                                    str(s.write("p.json.gz", gzip.compress(b"{}")))), True)
    yield Probe("calibrate", "--import a FIFO", cli("calibrate", "--import", str(s.fifo("p.json"))), True)
    yield Probe("calibrate", "--import /dev/zero", cli("calibrate", "--import", str(s.zero("p.json"))), True)
    yield Probe("calibrate", "--import a folder", cli("calibrate", "--import", str(s.root)), True)
    for target in ("/dev/full", str(s.root / "missing" / "dir" / "p.json"), str(s.root),
                   str(s.root / ("n" * 300 + ".json")), ""):
        yield Probe("calibrate", f"--export H200 {target[:40]!r}", cli("calibrate", "--export", "H200", target), True)
    yield Probe("calibrate", "--export an unknown GPU", cli("calibrate", "--export", "No Such GPU",
                                                            str(s.path("x.json"))), True)
    yield Probe("calibrate", "--export H200 to a good path", cli("calibrate", "--export", "H200",
                                                                  str(s.path("ok.json"))), False)
    ops = s.write("ops.jsonl", '{"kind": "case"}\n{"op": 5}\n')
    yield Probe("calibrate", "--from-ops rows missing fields", cli("calibrate", "--from-ops", str(ops), "--gpu",
                                                                   "H200"), True)
    for mib in ("nan", "inf", "-1", "1e400"):
        yield Probe("calibrate", f"--context-mib {mib}", cli("calibrate", "--from-ops", str(DATA /
                                                             "h200-kernel-ops.jsonl.gz"), "--gpu", "H200",
                                                             "--context-mib", mib), True)


def calibrate_list_probes(s: Scratch) -> Iterator[Probe]:
    """--list with one bad file in the user's profile folder (VRAMSCOPE_DATA_DIR points at the scratch folder)."""
    folder = Path(os.environ["VRAMSCOPE_DATA_DIR"]) / "gpu_profiles"
    for name, data in (("binary", b"\x00\xff" * 100), ("deep", b"[" * 100_000), ("not a profile", b"{}"),
                       ("text", b"hello")):
        def run(data: bytes = data) -> tuple[int, str, str]:
            import engine.cuda.gpu_profile as gp

            folder.mkdir(parents=True, exist_ok=True)
            bad = folder / "bad.json"
            bad.write_bytes(data)
            gp.reload_profiles()
            try:
                return cli("calibrate", "--list")()
            finally:
                bad.unlink()
                gp.reload_profiles()
        yield Probe("calibrate-list", f"--list with a {name} profile in the folder", run, False)


# ---------------------------------------------------------------------------------------------------------------
# output paths

def output_probes(s: Scratch) -> Iterator[Probe]:
    from engine.sketch.document import load_template

    sketch = s.path("tiny.json")
    load_template("mlp").save(sketch)
    est = ["estimate", str(sketch), "--device", "cpu"]
    link_dir = s.path("loop")
    link_dir.symlink_to(link_dir)
    targets: list[tuple[str, str, bool | None]] = [
        ("a 256-byte name", str(s.root / ("n" * 251 + ".json")), True),
        ("a 250-byte name", str(s.path("n" * 245 + ".json")), False),
        ("'-'", "-", True), ("''", "", True), ("'/'", "/", True), ("a folder", str(s.root), True),
        ("a missing folder", str(s.root / "missing" / "x.json"), True), ("/dev/full", "/dev/full", True),
        ("a link to itself", str(link_dir), True), ("a path through a file", str(sketch / "x.json"), True),
        ("a name with a newline", str(s.path("a\nb.json")), None),
        ("a named pipe no program reads", str(s.fifo("out.json")), True),
    ]
    for name, target, bad in targets:
        yield Probe("output", f"estimate -o {name}", cli(*est, "-o", target), bad, bound_s=60)
    rep = ["report", str(sketch), "--device", "cpu"]
    x = s.path("x.pdf")
    html = s.path("x.html")
    link = s.path("l.pdf")
    link.symlink_to(html)
    pairs: list[tuple[str, list[str]]] = [
        ("-o x.pdf --html x.pdf", ["-o", str(x), "--html", str(x)]),
        ("--html = --json", ["--html", str(html), "--json", str(html)]),
        ("-o a link to the --html target", ["-o", str(link), "--html", str(html)]),
        ("-o x.txt", ["-o", str(s.path("x.txt"))]), ("-o -", ["-o", "-"]), ("--html ''", ["--html", ""]),
    ]
    for name, extra in pairs:
        yield Probe("output", f"report {name}", cli(*rep, *extra), True, bound_s=60)
    for opt in ("--csv", "--jsonl"):
        for name, target in (("/dev/full", "/dev/full"), ("a missing folder", str(s.root / "m" / "r")),
                             ("''", ""), ("'-'", "-")):
            yield Probe("output", f"monitor {opt} {name}", cli("monitor", opt, target, "--once"), True)


# ---------------------------------------------------------------------------------------------------------------
# the app's own files: the stored settings, autosaves and sketches, read as the app reads them

def app_probes(s: Scratch) -> Iterator[Probe]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from engine.sketch.document import Sketch, load_template
    from gui.stored_settings import stored_config

    for value in (5, [1, 2], "not json", "[" * 100_000 + "]" * 100_000, '{"batch_size": "x"}',
                  '{"batch_size": [1], "optimizer": {"a": 1}}', "[]", "9" * 5000, True, None, b"\xff",
                  '{"batch_size": 1e400}', '{"mode": "generate", "new_tokens": -5}', '{"gpu": "\\u001b[2J"}',
                  "x" * 1_000_000, {"a": 1}, '{"precision": null}'):
        def run(value: Any = value) -> tuple[int, str, str]:
            cfg = stored_config(value)
            return 0, "" if cfg is None else cfg.to_json().__repr__(), ""
        yield Probe("app", f"settings 'config' = {repr(value)[:40]}", run, None)

    def autosave(original: Any = None, sketch: Any = None, raw: bytes | None = None) -> Path:
        d = s.path("autosave")
        d.mkdir()
        p = d / "autosave-1-1-aaaaaa.json"
        body = raw if raw is not None else json.dumps(
            {"format": "vramscope-autosave", "version": 1, "original_path": original, "saved_at": 1.0,
             "sketch": sketch if sketch is not None else load_template("mlp").to_json()}).encode()
        p.write_bytes(body)
        return d

    def recover(folder: Path) -> Callable[[], tuple[int, str, str]]:
        """The autosaves the app offers at start (SketchDocument.recoverable_choices: what it reads)."""
        def run() -> tuple[int, str, str]:
            from PySide6.QtWidgets import QApplication

            from gui.builder.document import SketchDocument

            _app = QApplication.instance() or QApplication([])
            doc = SketchDocument(autosave_dir=folder, autosave_interval_s=0)
            return 0, repr(doc.recoverable_choices())[:200], ""
        return run

    for original in (5, ["/etc/passwd"], {"a": 1}, True, "", "a\0b", "/etc/passwd", "x\n", "p" * 5000):
        yield Probe("app", f"autosave original_path {repr(original)[:30]}", recover(autosave(original)), None)
    for name, raw in (("binary", b"\x00\xff" * 50), ("deep", b"[" * 100_000), ("empty", b""),
                      ("another format", b'{"format": "x"}')):
        yield Probe("app", f"autosave {name}", recover(autosave(raw=raw)), None)
    fifo_dir = s.path("fifo_autosaves")
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "autosave-1-1-ffffff.json")
    yield Probe("app", "autosave that is a FIFO", recover(fifo_dir), None, bound_s=10)
    zero_dir = s.path("zero_autosaves")
    zero_dir.mkdir()
    (zero_dir / "autosave-1-1-zzzzzz.json").symlink_to("/dev/zero")
    yield Probe("app", "autosave linked to /dev/zero", recover(zero_dir), None, bound_s=10)
    good = load_template("mlp").to_json()
    node_id = dict(good, nodes=[dict(good["nodes"][0], id="fc\n")] + good["nodes"][1:])
    sketches: list[tuple[str, Path]] = [
        ("a FIFO", s.fifo("s.json")), ("a link to /dev/zero", s.zero("s.json")),
        ("binary", s.write("s.json", b"\x00\xff" * 100)), ("deep", s.write("s.json", "[" * 100_000)),
        ("a node id ending in a newline", s.write("s.json", json.dumps(node_id))),
        ("a 5000-digit field", s.write("s.json", json.dumps(good).replace('"out_features": ', '"out_features": '
                                                                            + "9" * 5000 + ", \"x\": ", 1))),
    ]
    for name, p in sketches:
        yield Probe("app", f"sketch {name}", call(lambda p=p: Sketch.load(p)), True, bound_s=10)


# ---------------------------------------------------------------------------------------------------------------

CLASSES: dict[str, tuple[str, Callable[[Scratch], Iterator[Probe]]]] = {
    "snapshots": ("`open` memory snapshots", snapshot_probes),
    "hf-config": ("Hugging Face config.json", hf_probes),
    "lora": ("LoRA / quantization / mode options", lora_probes),
    "calibrate": ("`calibrate --import/--export/--list`", calibrate_probes),
    "calibrate-list": ("`calibrate --list`, one bad file in the folder", calibrate_list_probes),
    "prometheus": ("`monitor --prometheus` against bad servers", prometheus_probes),
    "exporter": ("`monitor --serve-metrics` and its replays", exporter_probes),
    "output": ("output paths", output_probes),
    "app": ("the app's own files (settings, autosaves, sketches)", app_probes),
}


def _ceiling(extra: int) -> None:
    """The harness's own address-space ceiling: a probe that blows up ends in a MemoryError, not the machine's
    OOM killer."""
    with open("/proc/self/statm", "rb") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.getrlimit(resource.RLIMIT_AS)[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=list(CLASSES), help="these classes only")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--show", default="weak,failed", help="verdicts listed one by one (default weak,failed)")
    ap.add_argument("--memory-gib", type=float, default=8.0,
                    help="the harness's address-space ceiling above what it maps at the start (default 8)")
    args = ap.parse_args()
    import transformers  # noqa: F401 — with torch and the engine, imported once, before any bound starts

    import main as _entry

    del _entry
    _ceiling(int(args.memory_gib * GIB))
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="vramscope-probes-") as tmp:
        os.environ["VRAMSCOPE_DATA_DIR"] = str(Path(tmp) / "data")
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        t0 = time.monotonic()
        for key in args.only or list(CLASSES):
            root = Path(tmp) / key
            root.mkdir()
            for probe in CLASSES[key][1](Scratch(root)):
                outcomes.append(judge(probe))
                o = outcomes[-1]
                print(f"{o.verdict:<6} {o.seconds:6.2f} s  {o.cls:<11} {o.name[:70]}: {o.why[:90]}",
                      file=sys.stderr, flush=True)
        total_s = time.monotonic() - t0
    show = set(args.show.split(","))
    rows = []
    for key in args.only or list(CLASSES):
        mine = [o for o in outcomes if o.cls == key]
        counts = {v: sum(o.verdict == v for o in mine) for v in ("good", "weak", "failed")}
        rows.append((CLASSES[key][0], len(mine), counts["good"], counts["weak"], counts["failed"]))
    all_row = ("all", *(sum(r[i] for r in rows) for i in range(1, 5)))
    if args.markdown:
        print("| class | tried | good | weak | failed |\n| --- | ---: | ---: | ---: | ---: |")
        for r in [*rows, all_row]:
            print("| " + " | ".join(str(x) for x in r) + " |")
    else:
        for r in [*rows, all_row]:
            print(f"{r[0]:<55} {r[1]:>5} {r[2]:>5} {r[3]:>5} {r[4]:>5}")
    print(f"\n{len(outcomes)} probes in {total_s:.0f} s")
    for o in outcomes:
        if o.verdict in show:
            print(f"- {o.verdict}: {o.cls}: {o.name}: {o.why}")
    return 1 if any(o.verdict == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
