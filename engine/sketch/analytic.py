"""Closed-form memory figures of a sketch from its shapes alone (instant builder feedback), with their formulas.

Per layer: parameters, gradients, optimizer state and the activations autograd saves for backward (what each
op really keeps, checked against torch.autograd.graph.saved_tensors_hooks); then a layer-by-layer walk of
forward, backward and the optimizer step gives an approximate peak. The per-layer rules are engine.sketch.keep_rules',
the sizes that need no sketch engine.sketch.layer_math's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..config.optimizers import OPTIMIZER_TABLE
from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..results.types import CATEGORIES, Estimate, ModuleRow, PhaseSpan, TimelinePoint
from .catalogue import CATALOGUE
from .document import Sketch, checkpoint_node_ids
from .keep_rules import APPROXIMATE, LAYER_RULES, Rule, RuleArgs, commas, fmt_dims
from .layer_math import dtype_bytes
from .layer_types import Shape

# ---------------------------------------------------------------- results

@dataclass(frozen=True)
class NodeFigures:
    node_id: str
    type: str
    output_shape: Shape | None  # without the batch dimension
    error: str | None
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    saved_activation_bytes: int  # bytes this node allocates in forward that autograd keeps for backward
    output_bytes: int  # its output tensor (0 for views such as Flatten)
    formulas: dict[str, str] = field(default_factory=dict)  # figure name → human-readable formula

    @property
    def total_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes + self.gradient_bytes + self.optimizer_bytes + \
            self.saved_activation_bytes


# One step of the layer-by-layer walk: (phase, node id, {category: bytes}).
TimelineEntry = tuple[str, str, dict[str, int]]


@dataclass(frozen=True)
class AnalyticResult:
    config: TrainConfig
    nodes: dict[str, NodeFigures]  # node id → its figures, in topological order
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    saved_activation_bytes: int
    input_bytes: int
    peak_bytes: int
    peak_phase: str  # "forward" | "backward" | "optimizer"
    peak_node: str  # the node being run at the peak ('' in the optimizer step)
    breakdown_at_peak: dict[str, int]  # category → bytes (engine.results.types.CATEGORIES), adds up to peak_bytes
    formulas: dict[str, str]
    notes: tuple[str, ...]
    errors: dict[str, str]  # node id → reason, for nodes without a shape (left out of the totals)
    timeline: tuple[TimelineEntry, ...] = ()  # each step of the layer-by-layer walk

    @property
    def error_message(self) -> str:
        """Why the sketch has no whole-model figures, in the words the traced estimate uses ('' when it has)."""
        for nid, reason in self.errors.items():  # topological order: the first is the cause, the rest depend on it
            if reason and not reason.startswith("depends on "):
                kind = self.nodes[nid].type if nid in self.nodes else None
                return str(UserError(reason, where=f"node '{nid}'" + (f" ({kind})" if kind else "")))
        return next((f"node '{n}': {r}" for n, r in self.errors.items()), "")

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "nodes": {k: {**v.__dict__, "output_shape": list(v.output_shape) if v.output_shape else None}
                      for k, v in self.nodes.items()},
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "saved_activation_bytes": self.saved_activation_bytes,
            "input_bytes": self.input_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "peak_node": self.peak_node,
            "breakdown_at_peak": dict(self.breakdown_at_peak),
            "formulas": dict(self.formulas),
            "notes": list(self.notes),
            "errors": dict(self.errors),
            "timeline": [{"phase": ph, "node": n, "by_category": dict(c)} for ph, n, c in self.timeline],
        }

    def to_estimate(self, model_name: str = "sketch") -> Estimate:
        """The same figures as an engine.results.types.Estimate (source "analytic"), for views that render estimates."""
        peak = self.peak_bytes or 1
        grads_at_peak = self.breakdown_at_peak.get("gradients", 0) > 0
        rows = []
        for f in self.nodes.values():
            if f.type in ("Input", "Output") or f.error:
                continue
            at_peak = f.parameter_bytes + f.buffer_bytes + f.optimizer_bytes + f.saved_activation_bytes + \
                (f.gradient_bytes if grads_at_peak else 0)
            rows.append(ModuleRow(f.node_id, f.type, f.parameters, f.parameter_bytes, f.gradient_bytes,
                                  f.optimizer_bytes, f.saved_activation_bytes, at_peak, at_peak / peak))
        points = tuple(TimelinePoint(i, 1, ph, n, "", _categories(c)) for i, (ph, n, c) in enumerate(self.timeline))
        spans: list[PhaseSpan] = []
        start = 0
        for i in range(1, len(points) + 1):
            if i == len(points) or points[i].phase != points[start].phase:
                spans.append(PhaseSpan(1, points[start].phase, start, i - 1))
                start = i
        peak_index = next((p.index for p in points if p.total == self.peak_bytes), 0)
        return Estimate(
            model_name=model_name, config=self.config, parameters=self.parameters,
            trainable_parameters=self.parameters, peak_bytes=self.peak_bytes, peak_index=peak_index, peak_step=1,
            peak_phase=self.peak_phase, peak_module=self.peak_node, peak_op="",
            breakdown_at_peak=dict(self.breakdown_at_peak), per_module=tuple(rows), timeline=points,
            phases=tuple(spans), source="analytic", notes=self.notes)


# ---------------------------------------------------------------- the estimate

def analytic(sketch: Sketch, cfg: TrainConfig | None = None) -> AnalyticResult:
    cfg = cfg or TrainConfig()
    b = cfg.batch_size
    train = cfg.training
    pb = dtype_bytes(cfg.precision)
    act_b = 2 if cfg.precision in ("fp16", "bf16") else 4
    opt = cfg.optimizer if train else "none"
    k_state = OPTIMIZER_TABLE[opt].state_per_param

    shapes = sketch.infer_shapes(b)
    order = list(shapes)
    in_edges = {n: [e.src for e in es] for n, es in sketch.incoming().items()}

    ckpt: set[str] = set()
    if train and cfg.checkpointing:
        ckpt = set(checkpoint_node_ids(sketch))
    owner: dict[str, str] = {}  # node → the node whose storage its output is
    elem: dict[str, int] = {}
    size: dict[str, int] = {}  # bytes of each owned output tensor
    rules: dict[str, Rule] = {}
    figures: dict[str, NodeFigures] = {}
    errors: dict[str, str] = {}
    input_bytes = 0
    for n in order:
        node, res = sketch.nodes[n], shapes[n]
        lt = CATALOGUE[node.type]
        if res.shape is None:
            errors[n] = res.error or ""
            figures[n] = NodeFigures(n, node.type, None, res.error, 0, 0, 0, 0, 0, 0, 0, {})
            continue
        srcs = in_edges[n]
        in_el = tuple(elem[s] for s in srcs)
        if node.type == "Input":
            eb = 8 if node.fields["dtype"] == "int64" else act_b
            owner[n], elem[n] = n, eb
            size[n] = b * math.prod(res.shape) * eb
            input_bytes += size[n]
            rules[n] = Rule(out_elem=eb)
        else:
            in_grad = bool(srcs) and sketch.nodes[owner[srcs[0]]].type != "Input"
            rule = LAYER_RULES[lt.keeps](RuleArgs(node.fields, res.in_shapes, res.shape, b, in_el, cfg, in_grad))
            if not train:  # inference keeps nothing for backward
                rule = Rule(out_elem=rule.out_elem, fwd_scratch=rule.fwd_scratch)
            elif n in ckpt:
                # checkpointed: only the block's input is kept; its internals come back in backward
                rule.recompute = sum(x[1] for x in rule.extras)
                rule.extras, rule.saves_inputs, rule.saves_output = [], (0,), False
            if lt.alias or (lt.keeps == "dropout" and (node.fields["p"] == 0 or not train)):
                owner[n], elem[n] = owner[srcs[0]], elem[srcs[0]]
            else:
                owner[n], elem[n] = n, rule.out_elem
                size[n] = b * math.prod(res.shape) * rule.out_elem
            rules[n] = rule
        params = res.params
        bufs = lt.buffer_bytes(node.fields, res.in_shapes, pb)
        grads = params * pb if train else 0
        state = k_state * params * pb
        fm: dict[str, str] = {}
        if params:
            how = lt.param_formula(node.fields, res.in_shapes)
            fm["parameters"] = f"{how} = {commas(params)}" if how else commas(params)
            fm["parameter_bytes"] = f"{commas(params)} · {pb} B = {commas(params * pb)} B"
            if train:
                fm["gradient_bytes"] = f"{commas(params)} · {pb} B = {commas(grads)} B"
                fm["optimizer_bytes"] = (f"{k_state} · {commas(params)} · {pb} B = {commas(state)} B "
                                         f"({OPTIMIZER_TABLE[opt].state_what})")
        if bufs:
            fm["buffer_bytes"] = f"{commas(bufs)} B (running mean/var + int64 step counter)"
        out_b = size.get(n, 0) if owner[n] == n else 0
        fm["output"] = (f"{fmt_dims(res.shape, b, elem[n])} = {commas(b * math.prod(res.shape) * elem[n])} B"
                        + ("" if owner[n] == n else f" (a view of {owner[n]}'s output: no new memory)"))
        figures[n] = NodeFigures(n, node.type, res.shape, None, params, params * pb, bufs, grads, state, 0, out_b, fm)

    # which owned tensors autograd keeps, and by whom
    saved_by: dict[str, set[str]] = {}
    for n, r in rules.items():
        for port in r.saves_inputs:
            saved_by.setdefault(owner[in_edges[n][port]], set()).add(n)
        if r.saves_output:
            saved_by.setdefault(owner[n], set()).add(n)
    saved_bytes: dict[str, int] = {}
    for n in rules:
        if sketch.nodes[n].type == "Input":
            continue
        own = size[n] if (owner[n] == n and n in saved_by) else 0
        extra = sum(x[1] for x in rules[n].extras)
        saved_bytes[n] = own + extra
        if own or extra:
            parts = ([f"output {commas(own)} B (kept by {', '.join(sorted(saved_by[n]))})"] if own else []) + \
                [f"{lbl} {form} = {commas(v)} B" for lbl, v, form in rules[n].extras]
            figures[n].formulas["saved_activation_bytes"] = " + ".join(parts) + f" = {commas(own + extra)} B"
        figures[n] = replace(figures[n], saved_activation_bytes=own + extra)

    totals = {
        "parameters": sum(f.parameters for f in figures.values()),
        "parameter_bytes": sum(f.parameter_bytes for f in figures.values()),
        "buffer_bytes": sum(f.buffer_bytes for f in figures.values()),
        "gradient_bytes": sum(f.gradient_bytes for f in figures.values()),
        "optimizer_bytes": sum(f.optimizer_bytes for f in figures.values()),
        "saved_activation_bytes": sum(saved_bytes.values()),
    }
    peak, phase, at, breakdown, points = _walk(sketch, cfg, order, rules, owner, size, saved_by, in_edges, figures,
                                               totals, input_bytes, errors)
    formulas = {
        "parameter_bytes": f"{commas(totals['parameters'])} params · {pb} B = {commas(totals['parameter_bytes'])} B",
        "gradient_bytes": f"{commas(totals['parameters'])} · {pb} B = {commas(totals['gradient_bytes'])} B" if train
        else "0 B (inference keeps no gradients)",
        "optimizer_bytes": f"{k_state} · {commas(totals['parameters'])} · {pb} B = "
                           f"{commas(totals['optimizer_bytes'])} B ({OPTIMIZER_TABLE[opt].state_what})",
        "peak_bytes": " + ".join(f"{k} {commas(v)} B" for k, v in breakdown.items() if v) + f" = {commas(peak)} B "
                      f"({phase}{', at ' + at if at else ''})",
    }
    notes = [
        "Analytic approximation from shapes: leaves out backward-kernel scratch, convolution/LSTM workspaces "
        "beyond those listed, allocator rounding and fragmentation, and (on a GPU) the CUDA context.",
    ]
    if cfg.amp:
        notes.append("AMP: fp32 parameters, gradients and optimizer state (the master weights); matmul/conv "
                     "outputs in 2 B; half-precision copies of weights used in forward counted as activations.")
    if cfg.checkpointing and train:
        notes.append(f"Activation checkpointing: {len(ckpt)} repeated block(s) keep only their inputs and are "
                     "recomputed in backward" + (" (" + ", ".join(sorted(ckpt)) + ")" if ckpt else
                                                 "; the sketch has no repeated composite blocks to wrap"))
    if cfg.grad_accum > 1:
        notes.append(f"Gradient accumulation ({cfg.grad_accum} steps): gradients stay allocated through forward.")
    if any(CATALOGUE[sketch.nodes[n].type].keeps in APPROXIMATE for n in order if n not in errors):
        notes.append("Recurrent and attention layers use approximate formulas for their fused kernels.")
    if errors:
        notes.append(f"{len(errors)} node(s) without a shape are left out: " + ", ".join(errors))
    return AnalyticResult(cfg, figures, totals["parameters"], totals["parameter_bytes"], totals["buffer_bytes"],
                          totals["gradient_bytes"], totals["optimizer_bytes"], totals["saved_activation_bytes"],
                          input_bytes, peak, phase, at, breakdown, formulas, tuple(notes), errors, points)


def _walk(sketch: Sketch, cfg: TrainConfig, order: list[str], rules: dict[str, Rule], owner: dict[str, str],
          size: dict[str, int], saved_by: dict[str, set[str]], in_edges: dict[str, list[str]],
          figures: dict[str, NodeFigures], totals: dict[str, int], input_bytes: int, errors: dict[str, str]
          ) -> tuple[int, str, str, dict[str, int], tuple[TimelineEntry, ...]]:
    """Live bytes layer by layer through forward, backward and the optimizer step: the peak (bytes, phase, node,
    bytes by category) and the timeline."""
    train = cfg.training
    ok = [n for n in order if n not in errors]
    P, B_, G, OPT = (totals["parameter_bytes"], totals["buffer_bytes"], totals["gradient_bytes"],
                   totals["optimizer_bytes"])
    graph_outputs = {owner[n] for n in sketch.output_ids() if n in owner} if ok else set()
    extras = {n: sum(x[1] for x in rules[n].extras) for n in ok}
    is_input = {n for n in ok if sketch.nodes[n].type == "Input"}
    best: tuple[int, str, str, dict[str, int]] = (0, "forward", "", {})
    points: list[TimelineEntry] = []

    def record(phase: str, node: str, cats: dict[str, int]) -> None:
        nonlocal best
        points.append((phase, node, _categories(cats)))
        total = sum(cats.values())
        if total > best[0]:
            best = (total, phase, node, dict(cats))

    # forward: the step's second iteration, when optimizer state (and, accumulating, gradients) exist
    grads_fwd = G if (train and cfg.grad_accum > 1) else 0
    base = {"parameters": P, "buffers": B_, "gradients": grads_fwd, "optimizer_state": OPT, "inputs": input_bytes}
    last_use: dict[str, str] = {}
    for n in ok:
        for s in in_edges[n]:
            if s in owner:
                last_use[owner[s]] = n
    release: dict[str, list[str]] = {}
    for t, n in last_use.items():
        release.setdefault(n, []).append(t)
    live = 0
    alive: set[str] = set()
    for n in ok:
        if n in is_input:
            continue
        if owner[n] == n:
            live += size[n]
            alive.add(n)
        live += extras[n] if train else 0
        record("forward", n, {**base, "activations": live, "temporaries": rules[n].fwd_scratch})
        for t in release.get(n, ()):
            if t in alive and t not in graph_outputs and not (train and t in saved_by):
                live -= size[t]
                alive.discard(t)
    if not train:
        return best[0], best[1], best[2], _categories(best[3]), tuple(points)

    # backward: reverse order; gradients of parameters appear, saved tensors go as their nodes finish
    # the step drops its reference to the output once the loss is taken; only what autograd saved stays
    for t in graph_outputs:
        if t in alive and t not in saved_by:
            live -= size[t]
            alive.discard(t)
    remaining = {t: set(v) for t, v in saved_by.items()}
    keeps: dict[str, list[str]] = {}  # node → the tensors it saves
    for t, savers in saved_by.items():
        for n in savers:
            keeps.setdefault(n, []).append(t)
    grad_live: dict[str, int] = {}  # gradient w.r.t. each owned activation, while it is live
    pgrads = 0
    act = live
    for n in reversed(ok):
        if n in is_input:
            continue
        merge = CATALOGUE[sketch.nodes[n].type].keeps == "merge"
        if owner[n] == n:
            # the gradient w.r.t. this output: the loss's is an expand() view (free); the rest were made
            # by the consumers' backward. Add/Concat hand it (or slices of it) on to their inputs as is.
            g = grad_live.pop(n, 0)
            for s in in_edges[n]:
                t = owner[s]
                if t in is_input or _is_ids(s, owner, sketch) or t in grad_live:
                    continue
                grad_live[t] = 0 if merge else size[t]
                if merge:
                    grad_live[t], g = g, 0
            pgrads += figures[n].gradient_bytes
            # accumulating, each new parameter gradient is a temporary added into the kept .grad
            acc = (figures[n].gradient_bytes if grads_fwd else 0) + rules[n].recompute
            record("backward", n, {**base, "gradients": grads_fwd or pgrads, "activations": act,
                                   "temporaries": sum(grad_live.values()) + g + rules[n].bwd_scratch + acc})
        else:
            pgrads += figures[n].gradient_bytes
        act -= extras[n]
        for t in keeps.get(n, ()):
            if t not in remaining:
                continue
            remaining[t].discard(n)
            if not remaining[t]:
                del remaining[t]
                if t in alive:
                    act -= size[t]
                    alive.discard(t)
    # optimizer step (steady state: all state allocated) with its transient buffers
    temp = _optimizer_temp(cfg, figures, ok)
    record("optimizer", "", {**base, "gradients": G, "activations": act, "temporaries": temp})
    return best[0], best[1], best[2], _categories(best[3]), tuple(points)


def _is_ids(n: str, owner: dict[str, str], sketch: Sketch) -> bool:
    node = sketch.nodes[owner[n]]
    return node.type == "Input" and bool(node.fields["dtype"] == "int64")


def _optimizer_temp(cfg: TrainConfig, figures: dict[str, NodeFigures], ok: list[str]) -> int:
    spec = OPTIMIZER_TABLE[cfg.optimizer]
    if spec.cpu_step_temporaries == 0:
        return 0
    pb = dtype_bytes(cfg.precision)
    if cfg.device == "cuda":
        # the foreach implementations build one sqrt() temporary for every parameter at once
        return sum(figures[n].parameters for n in ok) * pb
    # CPU runs per tensor: Adam's sqrt() and its quotient coexist for the largest tensor
    largest = max((figures[n].parameters for n in ok), default=0) * pb
    return spec.cpu_step_temporaries * largest


def _categories(d: dict[str, int]) -> dict[str, int]:
    return {c: int(d.get(c, 0)) for c in CATEGORIES}
