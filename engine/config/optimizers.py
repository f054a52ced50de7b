"""The optimizers a configuration can name: one table, read by the config's validation, the traced step, the
analytic formulas, the planner's offers, the app's menu and the readers of a real step (a memory snapshot's
optimizer class and torch/optim file, a user's own step's optimizer): the maps below are derived from it. Adding an
optimizer is one entry here; tests/test_optimizers.py builds each entry's torch optimizer and checks the entry
against what it really keeps, and that a real step's readers name it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Optimizer:
    name: str  # as the CLI, the config and the saved JSON spell it
    label: str  # as the app shows it
    torch_class: str | None  # the torch.optim class the step builds (None: no optimizer step)
    kwargs: dict[str, Any] = field(default_factory=dict)  # constructor arguments besides the parameters
    state_per_param: int = 0  # state tensors it keeps per parameter, each the parameter's size
    state_what: str = ""  # what that state is, in the analytic formulas' words
    fused: bool = False  # its torch class has a fused (single-kernel) CUDA step: fused=True
    adaptive: bool = False  # keeps per-parameter second moments: the planner offers SGD with momentum instead
    cpu_step_temporaries: int = 0  # temporaries of the per-tensor CPU step, each the largest parameter's size
    library: str = "torch"  # whose optimizer: torch.optim, or bitsandbytes.optim (engine.trace.step)
    state_bytes: int | None = None  # bytes per state element when fixed (8-bit: 1), else the parameters' dtype
    eight_bit: str | None = None  # the 8-bit optimizer of the table the planner offers instead (bitsandbytes')
    torch_file: str | None = None  # torch/optim/<file>.py of its step, when not the class's name in lower case

    @property
    def two_moments(self) -> bool:
        """Adam's kind: a first and a second moment per parameter (what Adafactor factors and 8 bits shrink)."""
        return self.adaptive and self.state_per_param == 2

    @property
    def step_file(self) -> str | None:
        """The stem of torch/optim/<file>.py a memory snapshot's frames show for its step (torch's own only)."""
        if self.library != "torch" or self.torch_class is None:
            return None
        return self.torch_file or self.torch_class.lower()


OPTIMIZER_TABLE: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer("sgd", "SGD", "SGD", {"lr": 0.01}, 0, "plain SGD keeps no state", fused=True),
        Optimizer("sgd-momentum", "SGD + momentum", "SGD", {"lr": 0.01, "momentum": 0.9}, 1,
                  "SGD momentum: 1 buffer per parameter", fused=True),
        Optimizer("adam", "Adam", "Adam", {}, 2, "Adam: exp_avg + exp_avg_sq", fused=True, adaptive=True,
                  cpu_step_temporaries=2, eight_bit="adamw8bit"),
        Optimizer("adamw", "AdamW", "AdamW", {}, 2, "AdamW: exp_avg + exp_avg_sq", fused=True, adaptive=True,
                  cpu_step_temporaries=2, eight_bit="adamw8bit"),
        Optimizer("rmsprop", "RMSprop", "RMSprop", {}, 1, "RMSprop: square_avg", adaptive=True,
                  cpu_step_temporaries=1),
        Optimizer("adagrad", "Adagrad", "Adagrad", {}, 1, "Adagrad: sum of squares", fused=True, adaptive=True,
                  cpu_step_temporaries=1),
        Optimizer("adamw8bit", "AdamW 8-bit (bitsandbytes)", "AdamW8bit", {}, 2,
                  "AdamW8bit: exp_avg + exp_avg_sq in 8 bits, a float32 scale per 256 values", adaptive=True,
                  cpu_step_temporaries=2, library="bitsandbytes", state_bytes=1),
        Optimizer("paged-adamw8bit", "Paged AdamW 8-bit", "PagedAdamW8bit", {}, 2,
                  "PagedAdamW8bit: AdamW8bit's state in CUDA unified memory", adaptive=True,
                  cpu_step_temporaries=2, library="bitsandbytes", state_bytes=1),
        Optimizer("none", "None (no optimizer step)", None, {}, 0, "no optimizer"),
    )
}


def _first_names(pairs: Iterable[tuple[str | None, str]]) -> dict[str, str]:
    """{key: the table's name of the first entry with that key} (entries without one are left out)."""
    out: dict[str, str] = {}
    for key, name in pairs:
        if key is not None:
            out.setdefault(key, name)
    return out


# An optimizer class's name in lower case ("adamw", "pagedadamw8bit": a snapshot's Optimizer.step annotation, a user's
# step's optimizer) → the table's name. A class the table has twice names its first entry (SGD: "sgd"; the readers
# tell momentum from its state).
NAME_OF_CLASS = _first_names((o.torch_class.lower() if o.torch_class else None, o.name)
                             for o in OPTIMIZER_TABLE.values())
# torch/optim/<stem>.py in a snapshot's frames → the table's name
NAME_OF_STEP_FILE = _first_names((o.step_file, o.name) for o in OPTIMIZER_TABLE.values())
# bitsandbytes' optimizers: their step runs that library's kernels (engine.trace.step; the tracer decomposes them)
EIGHT_BIT_OPTIMIZERS = tuple(o.name for o in OPTIMIZER_TABLE.values() if o.library == "bitsandbytes")
