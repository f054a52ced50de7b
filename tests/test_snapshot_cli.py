"""`vramscope open SNAPSHOT`: the findings as text, JSON and reports; the estimate beside a real run; what would have
fit after an out-of-memory error; one line and exit 2 for a bad file. And `vramscope.record` around a loop."""

from __future__ import annotations

import gzip
import json
import pickle
import warnings
from pathlib import Path

import pytest

import main as entry
from engine.snapshots.file import load_snapshot_file
from engine.snapshots.reader import open_snapshot

DATA = Path(__file__).parent / "data"
GPT2 = str(DATA / "gpt2-b4-s512-adamw-ampbf16.pickle.gz")
OOM = str(DATA / "resnet50-b256-oom-at-4gib.pickle.gz")
MiB = 1 << 20


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = entry.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_open_explains_the_out_of_memory_error(capsys):
    rc, out, _ = run(capsys, "open", OOM)
    assert rc == 0
    assert "OUT OF MEMORY" in out and "tried to allocate 784.00 MiB" in out and "forward" in out
    assert "templates/resnet.py:49 in forward" in out
    assert "activations" in out and "Segments at the dump: 20" in out


def test_open_json_beside_the_estimate(capsys):
    rc, out, _ = run(capsys, "open", GPT2, "--model", "gpt2", "--seq-len", "512", "--json")
    assert rc == 0
    d = json.loads(out)
    snap = open_snapshot(GPT2)
    assert d["snapshot"]["peak_bytes"] == snap.peak_bytes
    assert d["estimate"]["config"]["batch_size"] == 4 and d["estimate"]["config"]["precision"] == "amp-bf16"
    rows = {r["figure"].strip(): r for r in d["comparison"]}
    assert rows["parameters at the peak"]["error_pct"] == 0.0
    assert abs(rows["max_memory_allocated"]["error_pct"]) < 1.0
    assert d["snapshot"]["model_name"].startswith("gpt2 (snapshot")


def test_open_warns_when_the_model_is_not_the_one_that_ran(capsys):
    # ResNet-50's snapshot beside ResNet-18: the run's parameter bytes are ResNet-50's (102,441,032, exactly what
    # `--model resnet50` estimates: the row's error is 0.0 %), 2.2 times ResNet-18's.
    rc, out, err = run(capsys, "open", OOM, "--model", "resnet18", "--no-plan")
    assert rc == 0 and "warning: --model resnet18: resnet18 holds 44.63 MiB of parameters in fp32, the run held " \
                       "97.70 MiB (2.2× less): it is not the model that ran; name the model that ran" in err
    rc, out, err = run(capsys, "open", OOM, "--model", "resnet50", "--no-plan", "--json")
    assert rc == 0 and "warning" not in err
    rows = {r["figure"].strip(): r for r in json.loads(out)["comparison"]}
    assert rows["parameters"]["measured"] == rows["parameters"]["estimate"] == 102_441_032


def test_what_would_have_fit_after_the_oom(capsys, tmp_path):
    report = tmp_path / "oom-report.json"
    rc, out, _ = run(capsys, "open", OOM, "--model", "resnet50", "--optimizer", "sgd-momentum", "--json",
                     "-o", str(report))
    assert rc == 0
    d = json.loads(out)
    fit = d["what_fits"]
    assert fit["budget_bytes"] == d["snapshot"]["extra"]["oom_detail"]["reserved_bytes"]
    assert fit["estimate_reserved"] > fit["budget_bytes"]  # the failed configuration does not fit, as it did not
    assert 1 <= fit["max_batch"] < 256
    fitting = [c for c in fit["changes"] if c["fits"]]
    assert fitting and all(c["new_reserved_bytes"] <= fit["budget_bytes"] for c in fitting)
    assert any(c["title"].startswith("Gradient accumulation") for c in fitting)
    assert d["estimate"]["config"]["batch_size"] == 256  # read from the input bytes
    # call sites named by the model's classes (its forwards' source lines); container frames add nothing
    assert d["snapshot"]["extra"]["oom_detail"]["module"] == "ResNet:86 › Bottleneck:49 › BatchNorm2d"
    rows = {r["figure"].strip(): r for r in d["comparison"]}
    assert set(rows) == {"parameters", "inputs"} and rows["inputs"]["error_pct"] == 0.0
    # the report says the same: each change with its verdict against the failed job's reserve, the largest batch
    facts = json.loads(report.read_text())["report"]
    assert [r["title"] for r in facts["recommendations"]] == [
        c["title"] + (" — fits" if c["fits"] else " — still too big") for c in fit["changes"]]
    assert [r["new_peak_bytes"] for r in facts["recommendations"]] == [c["new_reserved_bytes"] for c in fit["changes"]]
    assert facts["summary"]["max_batch"] == fit["max_batch"]


@pytest.mark.parametrize("suffix", [".json", ".html"])
def test_open_exports_the_findings_as_a_report(capsys, tmp_path, suffix):
    out_path = tmp_path / f"oom{suffix}"
    rc, _out, _ = run(capsys, "open", OOM, "-o", str(out_path))
    assert rc == 0 and out_path.exists()
    text = out_path.read_text()
    if suffix == ".json":
        d = json.loads(text)
        assert d["report"]["real_run"]["oom"]["requested_bytes"] == 784 * MiB
        assert d["report"]["method"]["source"] == "snapshot"
    else:
        assert "Out of memory:" in text and "784.00 MiB" in text


def test_bad_snapshot_is_one_line_and_exit_2(capsys, tmp_path):
    bad = tmp_path / "cut.pickle.gz"
    bad.write_bytes(Path(OOM).read_bytes()[:3000])
    rc, out, err = run(capsys, "open", str(bad))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "cut short" in err
    rc, _, err = run(capsys, "open", OOM, "-o", str(tmp_path / "x.txt"))
    assert rc == 2 and ".pdf, .html or .json" in err


# ---- vramscope.record


def test_record_without_a_gpu_warns_and_records_nothing(tmp_path, monkeypatch):
    import torch

    from vramscope import record

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="no CUDA GPU"):
        with record(tmp_path / "run.pickle.gz") as p:
            assert p is None
    assert not (tmp_path / "run.pickle.gz").exists()


class _FakeCuda:
    """torch.cuda's recording calls as a CUDA machine answers them, with a real snapshot's content."""

    def __init__(self):
        self.history: list[dict] = []
        self.observer = None
        self.data = load_snapshot_file(OOM)

    def record_history(self, enabled="all", **kw):
        self.history.append({"enabled": enabled, **kw})

    def snapshot(self):
        return self.data

    def attach(self, fn):
        self.observer = fn


def test_record_bounds_history_installs_the_observer_and_writes_atomically(tmp_path, monkeypatch):
    import torch

    import engine.snapshots.record as sr
    from vramscope import record

    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.snapshot)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", fake.attach, raising=False)
    monkeypatch.setattr(sr, "_observer_installed", False)
    path = tmp_path / "run.pickle.gz"
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with record(path, max_entries=5000):
            assert fake.history[0]["max_entries"] == 5000 and fake.observer is not None
            # the allocator calls the observer at the failing allocation, then raises
            with pytest.warns(RuntimeWarning, match="vramscope open"):
                fake.observer(0, 822083584, 3340478976, 145933598720)
            fake.data = {"segments": [], "device_traces": [[]]}  # what a later dump would see: not written
            raise RuntimeError("CUDA out of memory. Tried to allocate 784.00 MiB")
    assert fake.history[-1]["enabled"] is None  # recording stopped
    assert [p.name for p in tmp_path.iterdir()] == ["run.pickle.gz"]  # no temporary file left
    assert open_snapshot(path).oom.requested_bytes == 784 * MiB
    # a loop that ends normally writes the snapshot at the end (plain pickle for a .pickle name), even after an
    # out-of-memory error PyTorch recovered from (a cuDNN workspace it did without): that one is said once
    fake.data = load_snapshot_file(OOM)
    with record(tmp_path / "ok.pickle"), pytest.warns(RuntimeWarning) as said:
        fake.observer(0, 1, 2, 3)
        fake.observer(0, 1, 2, 3)
    assert len(said) == 1
    assert pickle.loads((tmp_path / "ok.pickle").read_bytes())["segments"] == fake.data["segments"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fake.observer(0, 1, 2, 3)  # outside any record(): the observer does nothing
    assert gzip.decompress(path.read_bytes())[:1] == b"\x80"


def _expandable_copy(tmp_path: Path, *, in_code: bool) -> str:
    """ResNet-18 b8's snapshot as if recorded with expandable segments (set in the variable, or in code)."""
    data = pickle.loads(gzip.decompress((DATA / "resnet18-b8-adam.pickle.gz").read_bytes()))
    data["allocator_settings"]["expandable_segments"] = True
    data["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "" if in_code else "expandable_segments:True"
    out = tmp_path / "expandable.pickle"
    out.write_bytes(pickle.dumps(data))
    return str(out)


def test_open_model_takes_the_snapshots_own_alloc_conf(capsys, tmp_path):
    # issue 26: --help says the default is the snapshot's PYTORCH_CUDA_ALLOC_CONF; the estimate beside an
    # expandable-segments run was modelled with the default allocator (reserved 504 MiB instead of 384 MiB)
    rc, out, _ = run(capsys, "open", _expandable_copy(tmp_path, in_code=False), "--model", "resnet18", "--json")
    assert rc == 0
    d = json.loads(out)
    from_snapshot = d["estimate"]
    assert from_snapshot["config"]["alloc_conf"] == "expandable_segments:True"
    assert any("read from the snapshot" in n and "expandable" in n for n in d["snapshot"]["notes"])
    rc, out, _ = run(capsys, "open", str(DATA / "resnet18-b8-adam.pickle.gz"), "--model", "resnet18", "--json",
                     "--alloc-conf", "expandable_segments:True")
    assert rc == 0
    given = json.loads(out)["estimate"]
    assert from_snapshot["gpu"]["reserved_bytes"] == given["gpu"]["reserved_bytes"]
    assert from_snapshot["peak_bytes"] == given["peak_bytes"]


def test_alloc_conf_of_a_snapshot_that_set_expandable_segments_in_code(tmp_path):
    from engine.snapshots.file import alloc_conf_of

    assert alloc_conf_of(load_snapshot_file(_expandable_copy(tmp_path, in_code=True))) == "expandable_segments:True"
    assert alloc_conf_of(load_snapshot_file(GPT2)) == ""
    assert alloc_conf_of({"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ["x"]}}) == ""


@pytest.mark.parametrize("conf, taken", [("expandable_segments:True,max_split_size_mb:256", True),
                                         ("expandable_segments:True,future_knob:1", False),
                                         ("garbage_collection_threshold:7", False)])
def test_a_snapshots_alloc_conf_is_taken_when_it_is_modelled_and_said_when_not(conf, taken):
    from dataclasses import replace

    from engine.planning.snapshot_fit import config_for

    snap = open_snapshot(str(DATA / "resnet18-b8-adam.pickle.gz"))
    snap = replace(snap, snapshot=replace(snap.snapshot, alloc_conf=conf))
    cfg, notes = config_for(snap, None, {})
    assert cfg.alloc_conf == (conf if taken else None)
    said = [n for n in notes if "PYTORCH_CUDA_ALLOC_CONF" in n]
    assert len(said) == 1 and (("read from the snapshot" in said[0]) if taken
                               else ("the default allocator assumed; give --alloc-conf" in said[0]))
    assert cfg == config_for(snap, None, {"alloc_conf": None})[0]
    assert config_for(snap, None, {"alloc_conf": "max_split_size_mb:128"})[0].alloc_conf == "max_split_size_mb:128"
