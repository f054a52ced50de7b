"""A 2-layer LSTM word language model in plain torch.nn: the default model of PyTorch's
examples/word_language_model (--model LSTM --emsize 200 --nhid 200 --nlayers 2 --dropout 0.2, untied,
bptt 35) over the WikiText-2 vocabulary of 33,278 words (Merity et al. 2016): 13,987,678 parameters.
Given `labels`, forward returns an LMOutput with `.loss` (next-token cross-entropy) and `.logits`.
"""

from __future__ import annotations

import torch
from torch import nn

from .inputs import check_seq_len, token_ids
from .lm_loss import LMOutput, lm_output

VOCAB = 33278
EMBED = 200
HIDDEN = 200
LAYERS = 2
DROPOUT = 0.2


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = VOCAB, embed: int = EMBED, hidden: int = HIDDEN, layers: int = LAYERS,
                 dropout: float = DROPOUT):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, embed)
        self.rnn = nn.LSTM(embed, hidden, layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        x, _ = self.rnn(self.drop(self.encoder(input_ids)))
        logits = self.decoder(self.drop(x))
        return lm_output(logits, labels)


def build_lstm_lm(batch_size: int, seq_len: int | None = None, image_size: int | None = None
                  ) -> tuple[LSTMLanguageModel, dict[str, torch.Tensor]]:
    n = check_seq_len("lstm-lm", seq_len, default=35)
    ids = token_ids(batch_size, n, VOCAB)
    return LSTMLanguageModel(), {"input_ids": ids, "labels": ids}
