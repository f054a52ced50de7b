"""What CUDA's fused nn.TransformerEncoderLayer inference kernel allocates, in the order it does.

`aten::_transformer_encoder_layer_fwd` (aten/src/ATen/native/transformers/transformer.cpp, the fast path
nn.TransformerEncoder takes in eval mode without grad) is one op to a fake tensor, but on the GPU it is a sequence:
the q/k/v projection (3 activations), the attention output, the output projection, a layer norm, the feed-forward
hidden layer and its output, another layer norm; each freed as soon as the C++ code drops it. Replayed through the
caching allocator as one block of their peak, they would take a segment of their own; as separate requests they
share segments the way the real ones do. The attention keeps no copy of its output (flash / cuDNN attention write
it in the [batch, seq, heads, dim] order the projection reads) and no log-sum-exp at inference.

Checked against the H200 (benchmarks/gpu/h200/ops-heldout.jsonl.gz, B 64, S 256, d 512, ff 2048, fp16): 96 MiB
above the input at the op's peak and one activation kept, as measured; and the case's max_memory_reserved.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ENCODER_LAYER = "_transformer_encoder_layer_fwd.default"

# One step of the sequence: (buffer name, bytes) allocates it, (buffer name, 0) frees it; "OUT" marks where the
# op's output (tracked as the op's own result) is allocated.
Step = tuple[str, int]
OUT: Step = ("OUT", 0)


def encoder_layer_sequence(args: Sequence[object]) -> list[Step] | None:
    """The allocations of one call, around its output; None when the call is not the plain dense path modelled
    (a nested tensor or a padding mask takes another one)."""
    if len(args) < 18:
        return None
    src = args[0]
    norm_first = args[8]
    ffn_w1 = args[14]
    mask = args[18] if len(args) > 18 else None
    if not isinstance(src, torch.Tensor) or src.is_nested or src.dim() != 3 or mask is not None:
        return None
    if not isinstance(ffn_w1, torch.Tensor) or ffn_w1.dim() != 2 or not isinstance(norm_first, bool):
        return None
    b, s, d = (int(x) for x in src.shape)
    e = src.element_size()
    u, hidden, stat = b * s * d * e, b * s * int(ffn_w1.shape[0]) * e, b * s * 4

    def norm(name: str) -> list[Step]:  # at::layer_norm: output, with mean and rstd made and dropped
        return [(name, u), ("mean", stat), ("rstd", stat), ("mean", 0), ("rstd", 0)]

    attention: list[Step] = [("qkv", 3 * u), ("attn", u), ("proj", u), ("qkv", 0), ("attn", 0)]
    if not norm_first:
        return (attention + norm("norm1") + [("proj", 0), ("hidden", hidden), ("ffn", u), ("hidden", 0)]
                + [OUT, ("mean", stat), ("rstd", stat), ("mean", 0), ("rstd", 0), ("ffn", 0), ("norm1", 0)])
    # norm_first: x = norm(src); x = attention(x) + src; x = ffn(norm(x)) + x; the ffn's output is returned
    return (norm("norm0") + attention + [("norm0", 0)] + norm("norm2") + [("hidden", hidden)]
            + [OUT, ("hidden", 0), ("norm2", 0), ("proj", 0)])
