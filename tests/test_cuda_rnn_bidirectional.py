"""A bidirectional cuDNN RNN on the CUDA target (engine.cuda.rnn): PyTorch's RNN.cpp makes the same requests per
call whatever the direction count (the time-major copy, output and states, workspace, reserve; the backward's data
and weight passes), so the traced requests are the unidirectional ones with twice the output width; their sizes come
from cuDNN and were fitted on unidirectional stacks only. A held-out bidirectional 2-layer LSTM tagger (embedding
128, hidden 192, 80 steps, batch 16, Adam) measured on the H200 was 12.5 % above the estimate's allocated figure and
34 % above its reserved one: the band the estimate gives must be honest about that."""

from __future__ import annotations

import torch
from torch import nn

import vramscope
from engine.cuda.rnn import sizes, spread_of


class Tagger(nn.Module):
    def __init__(self, bidirectional: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(5000, 128)
        self.rnn = nn.LSTM(128, 192, 2, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(192 * (2 if bidirectional else 1), 17)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


def _band(bidirectional: bool) -> tuple[int, int, int]:
    with vramscope.fake():
        model = Tagger(bidirectional)
    est = vramscope.estimate(model, torch.randint(0, 5000, (16, 80)), optimizer="adam", gpu="H200")
    assert est.gpu is not None
    return est.gpu.nvidia_smi_low_bytes, est.gpu.nvidia_smi_bytes, est.gpu.nvidia_smi_high_bytes


def test_sizes_count_both_directions():
    one = sizes("lstm", 2, 80, 16, 192, 1, 4)
    two = sizes("lstm", 2, 80, 16, 192, 2, 4)
    assert two[0] == 2 * one[0]  # the reserve: per direction
    assert spread_of(1) < spread_of(2) == 1.0


def test_a_bidirectional_rnn_gets_the_wider_band_of_an_unmeasured_rule():
    low1, mid1, high1 = _band(False)
    low2, mid2, high2 = _band(True)
    _reserve, workspace = sizes("lstm", 2, 80, 16, 192, 2, 4)
    # the band reaches a call's workspace above the figure (the measured miss on the H200: 34 % of reserved)
    assert high2 - mid2 >= workspace
    assert (high2 - mid2) - (high1 - mid1) >= workspace // 2
    assert low2 < mid2 < high2 and low1 < mid1 < high1
