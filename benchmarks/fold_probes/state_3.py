import functools
import random
import weakref

import torch

from tests.test_fold_declines import _Block, _Model


class B_LayerDrop(_Block):
    def forward(self, x):
        if self.training and random.random() < 0.1:
            return x
        return super().forward(x)
class M_LayerDrop(_Model):
    block = B_LayerDrop
    def forward(self, x):
        random.seed(1)
        return super().forward(x)

class B_LayerDropExtra(_Block):
    def forward(self, x):
        h = super().forward(x)
        if random.random() < 0.1:
            h = h + self.extra(h)
        return h
class M_LayerDropExtra(_Model):
    block = B_LayerDropExtra
    def forward(self, x):
        random.seed(1)
        return super().forward(x)

def _run(blocks, x):
    for b in blocks:
        x = b(x)
    return x
class B_Parent(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index)
        self.parent = None
    def forward(self, x):
        p = self.parent()
        p.seen += 1
        h = super().forward(x)
        if p.seen % 4 == 0:
            h = h + self.extra(h)
        return h
class M_ParentHelper(_Model):
    block = B_Parent
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        for b in self.blocks:
            b.parent = weakref.ref(self)
    def forward(self, x):
        self.seen = 0
        x = _run(self.blocks, self.inp(x))
        return self.head(x).sum()

class B_Next(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index)
        self.depth = 0
        self._next = []
    def forward(self, x):
        for nb in self._next:
            nb.depth = self.depth + 1
        h = super().forward(x)
        if self.depth % 4 == 3:
            h = h + self.extra(h)
        return h
_SINK = [B_Next(32)]
class M_Next(_Model):
    block = B_Next
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        bl = list(self.blocks._modules.values())
        for a, b in zip(bl, bl[1:] + _SINK):
            a._next.append(b)
    def forward(self, x):
        for b in self.blocks._modules.values():
            b.depth = 0
        return super().forward(x)

# per-block cache sharing a dict keyed by shape: first block fills
_MEMO = {}
class B_Memo(_Block):
    def forward(self, x):
        key = tuple(x.shape)
        if key not in _MEMO:
            _MEMO[key] = torch.ones(x.shape[-1])
        return super().forward(x) * _MEMO[key]
class M_Memo(_Model):
    block = B_Memo
    def forward(self, x):
        _MEMO.clear()
        return super().forward(x)

_MEMO2 = {}
class B_Memo2(_Block):
    def forward(self, x):
        m = _MEMO2.setdefault("n", [0])
        m[0] += 1
        h = super().forward(x)
        if m[0] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Memo2(_Model):
    block = B_Memo2
    def forward(self, x):
        _MEMO2.clear()
        return super().forward(x)

@functools.cache
def _mask(n, tag):
    return torch.ones(n)
class B_Lru(_Block):
    def forward(self, x):
        return super().forward(x) * _mask(x.shape[-1], id(self))
class M_Lru(_Model):
    block = B_Lru
    def forward(self, x):
        _mask.cache_clear()
        return super().forward(x)

# vars(self) / __dict__ / object.__setattr__ on own block (harmless expected)
class B_OwnDict(_Block):
    def forward(self, x):
        vars(self)["n"] = vars(self).get("n", 0) + 1
        self.__dict__["m"] = self.__dict__.get("m", 0) + 1
        object.__setattr__(self, "k", getattr(self, "k", 0) + 1)
        return super().forward(x)
class M_OwnDict(_Model):
    block = B_OwnDict

# vars(type(self)) class-level dict
class B_VarsType(_Block):
    reg = {}
    def forward(self, x):
        d = vars(type(self))["reg"]
        d["n"] = d.get("n", 0) + 1
        h = super().forward(x)
        if d["n"] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_VarsType(_Model):
    block = B_VarsType
    def forward(self, x):
        B_VarsType.reg.clear()
        return super().forward(x)

# class attribute list mutated via self (self.hist is class-level shared)
class B_ClsList(_Block):
    hist = []
    def forward(self, x):
        self.hist.append(1)
        h = super().forward(x)
        if len(self.hist) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_ClsList(_Model):
    block = B_ClsList
    def forward(self, x):
        B_ClsList.hist.clear()
        return super().forward(x)
