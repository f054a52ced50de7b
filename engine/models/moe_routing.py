"""Mixture-of-experts routing made deterministic, so that the tracer can size what a router's choice allocates.

A router's top-k choice depends on the data, and so do the sizes of what transformers' eager expert loop
allocates (`nonzero`, `torch.where`, the tokens gathered for each expert): fake tensors cannot know them. Under
VRAMScope the experts run an experts implementation registered with transformers (`vramscope-balanced`,
`vramscope-worst`) that is transformers' eager loop op for op — the (tokens, k, experts+1) one-hot mask, then for
each expert hit: the (n, 2) index pairs `torch.where` returns, the gathered tokens, gate/up projection, activation,
down projection, routing weight, `index_add_` — with the routing taken from a fixed plan instead of the router's
indices (the gate's own weights, softmax and top-k still run):

- balanced (default): token t's j-th choice is expert (t*k + j) mod E, so every expert gets tokens*k/E tokens
  (rounded up or down), as a load-balanced router does on average;
- worst: every token chooses experts 0..k-1, so those experts each get every token: the largest per-expert
  batch a router can produce (each expert sees a token at most once).

The same forward runs in a real run (engine.measure.cpu_profiler), so the two are compared like for like. This loop is
what a model gets only when it selects the eager implementation (`"experts_implementation": "eager"` in its config).
transformers 5's default, `grouped_mm` (on the CPU too), sorts the (tokens*k) pairs into one grouped matmul
instead; its buffers do not depend on the routing, so it is traced as it is (engine.trace.grouped_mm lets its fake
kernel take any dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn import functional as F

from ..core.errors import UserError

ROUTINGS = ("balanced", "worst")
IMPLEMENTATION = "vramscope-{}"  # the experts implementation's name for a routing


def routing_plan(tokens: int, top_k: int, num_experts: int, routing: str) -> list[list[int]]:
    """The (tokens, top_k) expert indices of `routing`, as lists (plain Python: no tensor values needed)."""
    if routing == "worst":
        return [list(range(top_k))] * tokens
    return [[(t * top_k + j) % num_experts for j in range(top_k)] for t in range(tokens)]


def per_expert_tokens(tokens: int, top_k: int, num_experts: int, routing: str) -> list[int]:
    """How many tokens each expert receives under `routing` (for the notes and the tests)."""
    counts = [0] * num_experts
    for row in routing_plan(tokens, top_k, num_experts, routing):
        for e in row:
            counts[e] += 1
    return counts


def _pairs_by_expert(plan: list[list[int]], num_experts: int) -> list[list[tuple[int, int]]]:
    """For each expert, the (top-k slot, token) pairs routed to it, in `torch.where`'s order (slot-major)."""
    pairs: list[list[tuple[int, int]]] = [[] for _ in range(num_experts)]
    for t, row in enumerate(plan):
        for j, e in enumerate(row):
            pairs[e].append((j, t))
    return [sorted(p) for p in pairs]


def _index_tensor(rows: list[list[int]] | list[tuple[int, int]], device: torch.device, fake: bool) -> torch.Tensor:
    """An int64 tensor of `rows`; on fake tensors an empty one of its size (a tensor made from Python values
    under fake mode is not seen by dispatch modes; its values are never needed there)."""
    if fake:
        return torch.empty((len(rows), len(rows[0]) if rows else 0), dtype=torch.long, device=device)
    return torch.tensor(rows, dtype=torch.long, device=device)


def _routed_forward(routing: str) -> Callable[..., torch.Tensor]:
    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if getattr(self, "has_bias", False) or getattr(self, "is_transposed", False) or \
                not getattr(self, "has_gate", True):
            raise UserError(f"{type(self).__name__}: VRAMScope's MoE routing supports gated experts without "
                            "biases (Mixtral, Qwen-MoE, DeepSeek-style)")
        tokens, top_k = top_k_index.shape
        experts = int(self.num_experts)
        device = hidden_states.device
        fake = isinstance(hidden_states, FakeTensor)
        plan = routing_plan(tokens, top_k, experts, routing)
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():  # eager's one-hot mask, its per-expert sums and the experts hit
            expert_mask = torch.zeros(tokens, top_k, experts + 1, dtype=torch.long, device=device)
            expert_mask.scatter_(-1, top_k_index.unsqueeze(-1), 1)
            expert_mask = expert_mask.permute(2, 1, 0)
            hit_sums = torch.greater(expert_mask.sum(dim=(-1, -2)), 0)
            by_expert = _pairs_by_expert(plan, experts)
            hit = [e for e in range(experts) if by_expert[e]]
            expert_hit = _index_tensor([[e] for e in hit], device, fake)  # nonzero's output
            del hit_sums
        for expert_idx in hit:
            index_pairs = _index_tensor(by_expert[expert_idx], device, fake)  # torch.where's, stacked
            top_k_pos, token_idx = index_pairs.unbind(1)
            current_state = hidden_states[token_idx]
            gate_up = F.linear(current_state, self.gate_up_proj[expert_idx])
            current_hidden_states = self._apply_gate(gate_up)
            current_hidden_states = F.linear(current_hidden_states, self.down_proj[expert_idx])
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
        del expert_mask, expert_hit
        return final_hidden_states

    return forward


DEFAULT = "grouped_mm"  # transformers' default experts implementation when none is asked for


def implementation(requested: str | None, routing: str) -> str:
    """The experts implementation a model is built with: what its config asks for, transformers' default
    (`grouped_mm`) when it asks for none, and for the eager loop this module's routed copy of it."""
    if requested == "eager":
        return IMPLEMENTATION.format(routing)
    return requested or DEFAULT


def describe(routing: str, implementation: str = IMPLEMENTATION.format("balanced")) -> str:
    """The note an estimate of a mixture-of-experts model carries."""
    if not implementation.startswith(IMPLEMENTATION.format("")):
        return (f"mixture of experts, transformers' {implementation} experts (its default): one grouped matmul over "
                "the tokens x top-k pairs, whose buffers do not depend on the routing (--moe-routing applies to "
                "the eager loop only)")
    if routing == "worst":
        return ("mixture of experts, worst-case routing: every token sent to the same top-k experts "
                "(--moe-routing balanced for an even spread)")
    return ("mixture of experts, balanced routing: each expert receives tokens x top-k / experts tokens "
            "(--moe-routing worst for the largest per-expert batch)")


def register() -> None:
    """Registers `vramscope-balanced` and `vramscope-worst` with transformers' experts interface (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    for routing in ROUTINGS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION.format(routing), _routed_forward(routing))


def is_moe(model_class: type) -> bool:
    """Whether transformers lets this class choose its experts implementation (its experts use the interface)."""
    can = getattr(model_class, "_can_set_experts_implementation", None)
    return bool(can()) if callable(can) else False
