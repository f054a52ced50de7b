"""A model file edited on disk while it is loaded: the fold's checks read the loops of the code that runs (the text
the file held when it was loaded), not the file's new text (engine.models.sources.FileSource)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.fold_identity import canonical_events
from engine.config.train_config import TrainConfig
from engine.models.sources import FileSource
from engine.trace.tracer import trace_model

MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, layers=12, d=32):
        super().__init__()
        self.inp, self.head = nn.Linear(d, d), nn.Linear(d, 10)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))

    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            if i == 8:
                break
            x = blk(x)
        return self.head(x).sum()


def build(batch_size):
    return Model(), {"x": torch.randn(batch_size, 16, 32)}
'''


def test_the_loop_read_is_the_loaded_one_not_the_file_edited_since(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    src = FileSource(path, "build")
    # Edited after loading: the break gone, every other line where it was. What runs still breaks at block 8.
    path.write_text(MODEL.replace("            if i == 8:\n                break\n", "            pass\n" * 2))
    cfg = TrainConfig(batch_size=2, optimizer="adamw", device="cpu", fold_own_code=True)
    folded, finfo = trace_model(src, cfg)
    full, info = trace_model(src, cfg.with_(full_trace=True))
    assert finfo.fold is not None and not finfo.fold.folded
    assert finfo.fold.reason is not None and "breaks out of it" in finfo.fold.reason
    assert canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    assert len([e for e in full.events if e.module.startswith("blocks.") and e.nbytes > 0 and e.phase == "forward"
                and e.module.split(".")[1] == "8"]) == 0  # (the break ran: block 8 never did)


def test_a_file_loaded_again_reads_its_new_text(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    FileSource(path, "build")
    path.write_text(MODEL.replace("            if i == 8:\n                break\n", ""))
    src = FileSource(path, "build")  # the app's reload
    folded, finfo = trace_model(src, TrainConfig(batch_size=2, optimizer="adamw", device="cpu", fold_own_code=True))
    assert finfo.fold is not None and finfo.fold.folded


HELPER = '''
def run_blocks(blocks, x):
    for i, blk in enumerate(blocks):
        if i == 8:
            break
        x = blk(x)
    return x
'''

USES_HELPER = MODEL.replace("import torch\n", "import torch\nfrom HELPER_MODULE import run_blocks\n", 1).replace(
    """        for i, blk in enumerate(self.blocks):
            if i == 8:
                break
            x = blk(x)
""", "        x = run_blocks(self.blocks, x)\n")


def test_a_neighbour_module_edited_while_loaded_is_read_as_it_was_imported(tmp_path: Path) -> None:
    helper = f"fold_helper_{tmp_path.name.replace('-', '_')}"  # (Python keeps a module imported: a name per test)
    (tmp_path / f"{helper}.py").write_text(HELPER)
    path = tmp_path / "model.py"
    path.write_text(USES_HELPER.replace("HELPER_MODULE", helper))
    src = FileSource(path, "build")
    # The neighbour edited after loading, the break gone, every other line where it was: the module imported runs.
    edited = HELPER.replace("        if i == 8:\n            break\n", "        pass\n" * 2)
    (tmp_path / f"{helper}.py").write_text(edited)
    cfg = TrainConfig(batch_size=2, optimizer="adamw", device="cpu", fold_own_code=True)
    folded, finfo = trace_model(src, cfg)
    full, info = trace_model(src, cfg.with_(full_trace=True))
    assert finfo.fold is not None and not finfo.fold.folded
    assert finfo.fold.reason is not None and "breaks out of it" in finfo.fold.reason
    assert canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    assert not any(e.module.startswith("blocks.8.") for e in full.events)  # (the break ran: block 8 never did)
