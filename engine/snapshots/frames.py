"""What one allocation's stack frames (in a PyTorch memory snapshot) say: the phase it belongs to, the module
and op that made it, whether it is a library workspace, and the configuration hints (autocast, checkpointing,
the optimizer class) a training step leaves in its frames."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.optimizers import NAME_OF_STEP_FILE

# hint: what the frames alone say about the allocation
OPT, BWD, FWD, PARAM, OTHER, NONE = "optimizer", "backward", "forward", "param", "other", "none"

_ATEN_OP = re.compile(r"^at::_ops::(\w+)::(?:call|redispatch)\(")
_WORKSPACE = ("getCurrentCUDABlasHandle", "getCUDABlasLtWorkspace", "setWorkspaceForHandle", "run_conv_plan",
              "Workspace(", "workspace(")
_CONTAINERS = ("container",)  # Sequential / ModuleList forwards: they name no module of their own


@dataclass(frozen=True)
class FrameFacts:
    hint: str
    module: str  # call sites of the module forwards, outermost first: "resnet.py:86 › resnet.py:49 › batchnorm.py"
    module_type: str  # the innermost forward's file, e.g. "batchnorm.py"
    op: str
    workspace: bool
    autocast: bool = False
    grad_scaler: bool = False
    checkpoint: bool = False
    optimizer_file: str = ""  # torch/optim/<name>.py seen in the frames
    fused: bool = False


def python_frames(frames: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(function, path, line) of the Python frames, innermost first."""
    out = []
    for fr in frames:
        f = fr.get("filename", "")
        if f.endswith(".py"):
            out.append((fr.get("name", ""), f.replace("\\", "/"), int(fr.get("line", 0) or 0)))
    return out


def stack_text(frames: Sequence[Mapping[str, Any]], limit: int = 40) -> tuple[str, ...]:
    """The Python stack as 'file:line in function', innermost first, without torch's module-call plumbing."""
    out = []
    for name, path, line in python_frames(frames):
        if name in ("_call_impl", "_wrapped_call_impl"):
            continue
        out.append(f"{_short(path)}:{line} in {name}")
        if len(out) >= limit:
            break
    return tuple(out)


def _short(path: str) -> str:
    i = path.rfind("/site-packages/")
    if i >= 0:
        return path[i + len("/site-packages/"):]
    parts = path.split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def _stem(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def classify(frames: Sequence[Mapping[str, Any]]) -> FrameFacts:
    py = python_frames(frames)
    cpp_names = [fr.get("name", "") for fr in frames if not fr.get("filename", "").endswith(".py")]
    workspace = any(w in n for n in cpp_names for w in _WORKSPACE)
    backward_thread = any(n.startswith("torch::autograd::Engine::") for n in cpp_names)
    op = ""
    for n in cpp_names:  # innermost first: the last aten op is the one Python called
        m = _ATEN_OP.match(n)
        if m:
            op = "aten::" + m.group(1)
    hint = NONE if not py and not backward_thread else OTHER
    autocast = any(n.startswith("at::autocast::") for n in cpp_names)
    grad_scaler = checkpoint = fused = False
    opt_file = ""
    calls: list[tuple[str, int]] = []  # (file, line) of each module forward, innermost first
    for i, (name, path, _line) in enumerate(py):
        if "/torch/optim/" in path:
            hint = OPT if hint not in (BWD,) else hint
            stem = _stem(path).removesuffix(".py")
            if stem in NAME_OF_STEP_FILE:
                opt_file = stem
            if name.startswith("_fused_") or "fused" in name:
                fused = True
        elif "/torch/autograd/" in path or (path.endswith("/torch/_tensor.py") and name == "backward"):
            hint = BWD
        elif path.endswith("/torch/utils/checkpoint.py"):
            checkpoint = True
        elif path.endswith("autocast_mode.py"):
            autocast = True
        elif path.endswith("grad_scaler.py"):
            grad_scaler = True
        if name == "_call_impl" and i > 0:
            _name, cpath, cline = py[i - 1]
            calls.append((cpath, cline))
    if backward_thread:
        hint = BWD
    if hint == OTHER:
        if calls:
            hint = FWD
        elif any(p.endswith("/torch/nn/modules/module.py") and n in ("_apply", "convert", "to", "cuda")
                 for n, p, _ in py) or any(p.endswith("/torch/nn/init.py") for _, p, _ in py):
            hint = PARAM
    if not op and py:
        op = py[0][0]
    module = module_type = ""
    if calls:
        outer = [c for c in reversed(calls) if _stem(c[0]).removesuffix(".py") not in _CONTAINERS]
        if outer:
            module_type = _stem(outer[-1][0])
            module = " › ".join([f"{_stem(p)}:{ln}" for p, ln in outer[:-1]] + [module_type])
    return FrameFacts(hint, module, module_type, op, workspace, autocast, grad_scaler, checkpoint, opt_file, fused)
