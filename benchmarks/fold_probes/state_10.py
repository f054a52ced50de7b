from torch import nn

from tests.test_fold_declines import _Block, _Model


class B_RefNorm(_Block):
    def __init__(self, d, index=0, norm=None):
        super().__init__(d, index)
        self.shared = [norm]          # a list, so the norm is registered once (on the model)
    def forward(self, x):
        norm = self.shared[0]
        norm.calls += 1
        h = super().forward(norm(x))
        if norm.calls > 9:
            h = h + self.extra(h)
        return h
class M_RefNorm(_Model):
    def __init__(self, layers=12, d=32):
        nn.Module.__init__(self)
        self.inp = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.blocks = nn.ModuleList(B_RefNorm(d, i, self.norm) for i in range(layers))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        self.norm.calls = 0
        return super().forward(x)

class CountingNorm(nn.LayerNorm):
    def forward(self, x):
        self.calls += 1
        y = super().forward(x)
        if self.calls > 9:
            y = y * 2 + 1
        return y
class B_RefCounting(_Block):
    def __init__(self, d, index=0, norm=None):
        super().__init__(d, index)
        self.shared = [norm]
    def forward(self, x):
        return super().forward(self.shared[0](x))
class M_RefCounting(_Model):
    def __init__(self, layers=12, d=32):
        nn.Module.__init__(self)
        self.inp = nn.Linear(d, d)
        self.norm = CountingNorm(d)
        self.blocks = nn.ModuleList(B_RefCounting(d, i, self.norm) for i in range(layers))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        self.norm.calls = 0
        return super().forward(x)
