"""The output of the language-model templates and their next-token loss, computed the Hugging Face way."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LMOutput(dict[str, torch.Tensor]):
    """A dict that also reads as attributes (`out.loss`, `out["loss"]`), like transformers' ModelOutput."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of token t+1 given tokens <= t.

    As transformers >= 4.46 does: logits are upcast to float32 and the labels (not the logits) are shifted,
    padded with `ignore_index`, so no shifted copy of the large logits tensor is made.
    """
    logits = logits.float()
    shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), shifted.view(-1), ignore_index=ignore_index)


def lm_output(logits: torch.Tensor, labels: torch.Tensor | None) -> LMOutput:
    """What the LM templates return, in transformers' order: the next-token loss first (when labels are given),
    then the logits."""
    out = LMOutput()
    if labels is not None:
        out["loss"] = causal_lm_loss(logits, labels)
    out["logits"] = logits
    return out
