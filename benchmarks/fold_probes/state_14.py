import torch
from torch import nn

from tests.test_fold_declines import _Block, _Model


class B_OwnHooks(_Block):
    def forward(self, x):
        h = super().forward(x)
        if not self._forward_pre_hooks:
            h = h + self.extra(h)
        return h
class M_OwnHooks(_Model):
    block = B_OwnHooks

class B_Lazy(nn.Module):
    def __init__(self, d, index=0):
        super().__init__()
        self.up, self.down = nn.LazyLinear(4 * d), nn.LazyLinear(d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))
class M_Lazy(_Model):
    block = B_Lazy

class B_Freeze(_Block):
    def forward(self, x):
        self.extra.weight.requires_grad_(False)
        self.extra.bias.requires_grad_(False)
        h = super().forward(x)
        return h + self.extra(h)
class M_Freeze(_Model):
    block = B_Freeze

class B_LazyParam(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.gain = None
    def forward(self, x):
        if self.gain is None:
            self.gain = nn.Parameter(torch.ones(x.shape[-1] * 8, device=x.device)[: x.shape[-1]])
        return super().forward(x) * self.gain
class M_LazyParam(_Model):
    block = B_LazyParam

class B_Cast(_Block):
    def forward(self, x):
        if self.extra.weight.dtype != torch.bfloat16:
            self.extra.to(torch.bfloat16)
        h = super().forward(x)
        return h + self.extra(h.bfloat16()).float()
class M_Cast(_Model):
    block = B_Cast
