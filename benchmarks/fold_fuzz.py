"""Folded against full traces on random user-style models (issue 24): a fuzz of what user code does with a stack.

    python -m benchmarks.fold_fuzz [--n 300] [--seed 1234] [--write]

Each case is a model written as a Python file (the fold's checks read the model's source, as they do a user's file
loaded by `file.py:function`) from random choices: how the stack is gone through (a `for`, `enumerate`, an index
loop, a `break`, a comprehension, a helper function, `islice`, a filtering generator), what the loop carries (a
count, a flag cleared after the first block, each block's output kept, a list indexed by the block's index, keywords,
a counter on the model, a count in a function that reads its own frame), what the block does (its index attribute as
a path, a scale or handed to a helper, a count it is handed, a shared list or closure, its own counter, a count kept
in a dict that an object of each block's own holds for all), whether the blocks are alike or two kinds alternate (a
period of 2), what comes after the stack (the last output, a stacked list, the list's length, the loop's index), and
the step (fp32 or bf16, AdamW or SGD, checkpointing, two micro-batches). Each is traced folded and with
`--full-trace` (CPU target) and put in one of: folded and event for event the full trace; declined (traced in full,
so exact); **folded and not the same** (a wrong fold: must be 0); the folded trace failed; the model's own error
(its full trace fails too).
Every case is the user's own code, which by default is traced in full (engine.trace.fold_known): the fuzz asks for
its fold (fold_own_code) to put the checks to work. `--write` adds the run to the table in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fold_identity import canonical_events  # noqa: E402
from engine.config.train_config import TrainConfig  # noqa: E402
from engine.models.sources import FileSource  # noqa: E402
from engine.trace.tracer import trace_model  # noqa: E402

BEGIN, END = "<!-- fold-fuzz:begin -->", "<!-- fold-fuzz:end -->"

# What a block does besides its two linear layers: (name, forward body lines, extra __init__ lines).
BLOCKS = {
    "plain": ([], []),
    "index path": (["if self.layer_idx % 4 == 0:", "    h = h + self.extra(h)"], []),
    "index scale": (["h = h * (1.0 / (1 + self.layer_idx))"], []),
    "own counter": (["self.calls = getattr(self, 'calls', 0) + 1"], []),
    "handed count": (["if n > 6:", "    h = h + self.extra(h)"], []),
    "shared list": (["self.log.append(1)", "if len(self.log) % 4 == 0:", "    h = h + self.extra(h)"], []),
    "shared closure": (["if self.tick() > 6:", "    h = h + self.extra(h)"], []),
    "settings read": (["if self.settings['residual']:", "    h = h + x"], []),
    "index to helper": (["h = every_fourth(h, self.extra, self.layer_idx)"], []),
    "name to helper": (["h = by_name(h, self.extra, f'block{self.layer_idx}')"], []),
    "alias log": (["log = self.log", "log.append(1)", "if len(log) > 6:", "    h = h + self.extra(h)"], []),
    "deep count": (["self.holder.box['n'] += 1", "if self.holder.box['n'] > 6:", "    h = h + self.extra(h)"], []),
    "deep read": (["if self.holder.box['n'] == 0:", "    h = h + x"], []),
}

# How the model's forward goes through the stack: lines inside forward (x is the input after self.inp; `blk(x)`
# stands for the block's call, which CALL replaces).
LOOPS = {
    "for": ["for blk in self.blocks:", "    x = CALL"],
    "enumerate": ["for i, blk in enumerate(self.blocks):", "    x = CALL"],
    "range len": ["for i in range(len(self.blocks)):", "    blk = self.blocks[i]", "    x = CALL"],
    "break at 8": ["for i, blk in enumerate(self.blocks):", "    if i == 8:", "        break", "    x = CALL"],
    "helper": ["x = run_all(self.blocks, x, lambda blk, x, n: CALL)"],
    "islice": ["for blk in itertools.islice(self.blocks, 9):", "    x = CALL"],
    "filtered": ["for blk in (b for j, b in enumerate(self.blocks) if j < 9):", "    x = CALL"],
    "comprehension run": ["outs_c = [x := CALL for blk in self.blocks]"],
}

CARRIES = ["nothing", "count", "count used", "flag", "kept outputs", "widths list", "uniform list", "keywords",
           "model counter", "masks list", "periodic list", "frame read"]
AFTER = ["last", "stacked", "length", "kept last", "index after"]

HEADER = '''
import functools
import itertools
import sys
import types
import torch
from torch import nn


def run_all(blocks, x, call):
    n = 0
    for blk in blocks:
        x = call(blk, x, n)
    return x


def every_fourth(h, lin, index):
    if index % 4 == 0:
        h = h + lin(h)
    return h


def by_name(h, lin, name):
    if name.endswith(("4", "8")):
        h = h + lin(h)
    return h


def make_counter():
    n = 0

    def tick():
        nonlocal n
        n += 1
        return n

    return tick
'''


def model_source(rng: random.Random) -> tuple[str, dict[str, str]]:
    """A model file's text and the choices it was made from."""
    block = rng.choice(list(BLOCKS))
    loop = rng.choice(list(LOOPS))
    carry = rng.choice(CARRIES)
    after = rng.choice(AFTER)
    period = rng.choice([1, 1, 2])
    layers = rng.randint(8, 14) if period == 1 else rng.randint(11, 16)
    d = rng.choice([16, 32])
    body, _ = BLOCKS[block]
    takes_n = block == "handed count" or carry == "keywords"
    lines = [HEADER, f"PERIOD = {period}", "", "class Block(nn.Module):", "    def __init__(self, d, index):",
             "        super().__init__()", "        self.layer_idx = index",
             "        w = 4 * d if PERIOD == 1 or index % 2 else 2 * d  # (period 2: narrow and wide blocks alternate)",
             "        self.up, self.down, self.extra = nn.Linear(d, w), nn.Linear(w, d), nn.Linear(d, d)", "",
             f"    def forward(self, x{', n=0' if takes_n else ''}):",
             "        h = self.down(torch.relu(self.up(x)))",
             *[f"        {b}" for b in body], "        return x + h", "", "",
             "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
             f"        self.inp, self.head = nn.Linear({d}, {d}), nn.Linear({d}, 10)",
             f"        self.blocks = nn.ModuleList(Block({d}, i) for i in range({layers}))",
             f"        self.widths = [{d}] * 6 + [{d // 2}] * {layers - 6}",
             f"        self.scales = [0.5] * {layers}",
             f"        self.pscales = [0.5, 0.25] * {layers // 2} + [0.5] * {layers % 2}",
             f"        self.masks = [torch.ones(4)] * 6 + [torch.ones(4096)] * {layers - 6}",
             "        self.seen = 0",
             "        shared, tick, box = [], make_counter(), {'n': 0}",
             "        for b in self.blocks:",
             "            b.log, b.tick, b.settings = shared, tick, {'residual': True}",
             "            b.holder = types.SimpleNamespace(box=box)  # (one of its own, holding one for all)", "",
             "    def forward(self, x):", "        x = self.inp(x)",
             "        n, first, outs, kw, i = 0, True, [], {'n': 0}, 0", "        self.seen = 0"]
    call = "blk(x, n)" if block == "handed count" else "blk(x, **kw)" if carry == "keywords" else "blk(x)"
    loop_lines = list(LOOPS[loop])
    if carry != "nothing" and loop not in ("helper", "comprehension run"):
        extra = {"count": ["n += 1"], "count used": ["n += 1", "x = x if n < 7 else x.detach()"],
                 "flag": ["x = x * (2.0 if first else 1.0)", "first = False"], "kept outputs": ["outs.append(x)"],
                 "widths list": ["x = torch.cat([x[..., : self.widths[i]], x[..., self.widths[i]:].detach()], -1)"],
                 "uniform list": ["x = x * self.scales[i]"], "keywords": ["kw['n'] += 1"],
                 "periodic list": ["x = x * self.pscales[i]"],
                 "model counter": ["self.seen += 1", "x = x if self.seen < 7 else x.detach()"],
                 "masks list": ["x = x + (self.masks[i] * 2).sum()"],
                 "frame read": ["n += 1", "sys._getframe()", "x = x if n < 7 else x.detach()"]}[carry]
        if carry in ("widths list", "uniform list", "masks list", "periodic list") and \
                loop not in ("enumerate", "range len", "break at 8"):
            extra = []  # (no index to take by)
        loop_lines += [f"    {e}" for e in extra]
    if block == "handed count" and loop not in ("helper", "comprehension run") and carry not in ("count", "count used"):
        loop_lines += ["    n += 1"]
    lines += [f"        {ln.replace('CALL', call)}" for ln in loop_lines]
    tail = {"last": "x", "stacked": "torch.stack(outs).sum(0) if outs else x",
            "length": "x + x.new_zeros(len(outs) + 1, 1, 1).sum(0)", "kept last": "outs[-1] if outs else x",
            "index after": "x + x.new_zeros(i + 1, 1, 1).sum(0)"}[after]
    lines += [f"        y = {tail}", "        return self.head(y).sum()", "", "",
              "def build(batch_size):", f"    return Model(), {{'x': torch.randn(batch_size, 8, {d})}}", ""]
    return "\n".join(lines), {"block": block, "loop": loop, "carry": carry, "after": after, "layers": str(layers),
                              "period": str(period)}


def step_config(rng: random.Random, target: str = "cpu") -> TrainConfig:
    """The step: on the CPU target fp32 or bf16; on a CUDA target (an H100: its allocator, kernels' scratch and
    workspaces) fp32, bf16 or AMP."""
    precisions = ["fp32", "fp32", "bf16"] if target == "cpu" else ["fp32", "bf16", "amp-bf16", "amp-fp16"]
    place = {"device": "cpu"} if target == "cpu" else {"device": "cuda", "gpu": "H100"}
    return TrainConfig(batch_size=2, optimizer=rng.choice(["adamw", "sgd"]), precision=rng.choice(precisions),
                       checkpointing=rng.random() < 0.2, grad_accum=rng.choice([1, 1, 1, 2]), fold_own_code=True,
                       **place)


def run(n: int, seed: int, target: str = "cpu") -> tuple[dict[str, int], list[str]]:
    rng = random.Random(seed)
    counts = {"same": 0, "declined": 0, "WRONG": 0, "failed": 0, "model error": 0}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in range(n):
            text, choices = model_source(rng)
            cfg = step_config(rng, target)
            path = Path(tmp) / f"case{case}.py"
            path.write_text(text)
            try:
                src = FileSource(path, "build")
                full, info = trace_model(src, cfg.with_(full_trace=True))
            except Exception:  # noqa: BLE001 - the model's own error (a recomputation that differs): not ours
                counts["model error"] += 1
                continue
            try:
                folded, finfo = trace_model(src, cfg)
            except Exception as e:  # noqa: BLE001 - a failed case is counted and shown, the fuzz goes on
                counts["failed"] += 1
                notes.append(f"case {case} {choices}: {type(e).__name__}: {str(e)[:200]}")
                traceback.print_exc(limit=2)
                continue
            same = canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
            folded_ok = finfo.fold is not None and finfo.fold.folded
            kind = "declined" if not folded_ok and same else "same" if same else "WRONG"
            counts[kind] += 1
            if kind == "WRONG":
                notes.append(f"case {case} {choices} {cfg.precision} {cfg.optimizer} ckpt={cfg.checkpointing} "
                             f"accum={cfg.grad_accum}: folded={folded_ok}")
                (ROOT / "benchmarks" / f"fold_fuzz_wrong_{seed}_{case}.py").write_text(text)
            print(f"{case:4d} {kind:8s} {choices}", flush=True)
    return counts, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--target", choices=["cpu", "cuda"], default="cpu", help="the step's device (cuda: an H100)")
    ap.add_argument("--write", action="store_true", help="add the run to the table in benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    counts, notes = run(args.n, args.seed, args.target)
    took = time.perf_counter() - t0
    where = ", CUDA target" if args.target == "cuda" else ""
    row = (f"| {args.seed}, {args.n}{where} | {counts['same']} | {counts['declined']} | **{counts['WRONG']}** | "
           f"{counts['failed']} | {counts['model error']} | {took:.0f} s |")
    print(row)
    for note in notes:
        print(note)
    if args.write:
        results = ROOT / "benchmarks" / "RESULTS.md"
        body = results.read_text()
        head = ("Command: `python -m benchmarks.fold_fuzz --n N --seed S [--target cuda] --write` (CPU target, or an "
                "H100 target with AMP among the precisions; torch "
                f"{torch.__version__}, {platform.machine()}, {time.strftime('%Y-%m-%d')}). Every case is the user's "
                "own code, asked to fold (fold_own_code: by default it is traced in full). A wrong fold's model is "
                "kept as benchmarks/fold_fuzz_wrong_SEED_CASE.py.\n\n"
                "| seed, cases | folded, event for event the full trace | declined (traced in full, so exact) | "
                "folded and NOT the same | failed (folded only) | the model's own error (full trace too) | time |\n"
                "|---|---:|---:|---:|---:|---:|---:|")
        title = "### Folded against full traces: the fold fuzz (issue 24)"
        if BEGIN in body:
            a, b = body.index(BEGIN), body.index(END)
            rows = [ln for ln in body[a:b].splitlines() if ln.startswith("| ") and not ln.startswith("| seed")]
            block = "\n".join([BEGIN, title, "", head, *rows, row, END])
            body = body[:a] + block + body[b + len(END):]
        else:
            section = [BEGIN, title, "", head, row, END]
            body = body.rstrip() + "\n\n" + "\n".join(section) + "\n"
        results.write_text(body)
    return 1 if counts["WRONG"] else 0


if __name__ == "__main__":
    sys.exit(main())
