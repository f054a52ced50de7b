import collections
import contextvars
import heapq
import itertools
import random

from torch import nn

from tests.test_fold_declines import _Block, _Model


def _shared_model(block_cls, make):
    class M(_Model):
        def __init__(self, layers=12, d=32):
            nn.Module.__init__(self)
            self.inp = nn.Linear(d, d)
            obj = make()
            self.blocks = nn.ModuleList(block_cls(d, i, obj) for i in range(layers))
            self.head = nn.Linear(d, 10)
    return M

class B_SharedRng(_Block):
    def __init__(self, d, index=0, rng=None):
        super().__init__(d, index); self.rng = rng
    def forward(self, x):
        h = super().forward(x)
        if self.rng.random() < 0.1:
            h = h + self.extra(h)
        return h
class M_SharedRng(_shared_model(B_SharedRng, lambda: random.Random(0))):
    def forward(self, x):
        self.blocks[0].rng.seed(1)
        return super().forward(x)

class B_SharedIter(_Block):
    def __init__(self, d, index=0, it=None):
        super().__init__(d, index); self.pattern = it
    def forward(self, x):
        h = super().forward(x)
        if next(self.pattern):
            h = h + self.extra(h)
        return h
class M_SharedIter(_shared_model(B_SharedIter, lambda: itertools.cycle([0, 0, 0, 1]))):
    pass

class B_SharedDeque(_Block):
    def __init__(self, d, index=0, q=None):
        super().__init__(d, index); self.q = q
    def forward(self, x):
        h = super().forward(x)
        self.q.rotate(1)
        if self.q[0]:
            h = h + self.extra(h)
        return h
class M_SharedDeque(_shared_model(B_SharedDeque, lambda: collections.deque([0, 0, 0, 1]))):
    def forward(self, x):
        q = self.blocks[0].q; q.clear(); q.extend([0, 0, 0, 1])
        return super().forward(x)

class B_SharedHeap(_Block):
    def __init__(self, d, index=0, hp=None):
        super().__init__(d, index); self.hp = hp
    def forward(self, x):
        heapq.heappush(self.hp, 1)
        h = super().forward(x)
        if len(self.hp) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_SharedHeap(_shared_model(B_SharedHeap, list)):
    def forward(self, x):
        self.blocks[0].hp.clear()
        return super().forward(x)

_CV = contextvars.ContextVar("n", default=0)
class B_CtxVar(_Block):
    def forward(self, x):
        _CV.set(_CV.get() + 1)
        h = super().forward(x)
        if _CV.get() % 4 == 0:
            h = h + self.extra(h)
        return h
class M_CtxVar(_Model):
    block = B_CtxVar
    def forward(self, x):
        _CV.set(0)
        return super().forward(x)

class B_Steps(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.steps = 0
    def forward(self, x):
        self.steps += 1
        h = super().forward(x)
        if self.steps % 2 == 0:
            h = h + self.extra(h)
        return h
class M_Steps(_Model):
    block = B_Steps

ACTS = []
class B_GlobalActs(_Block):
    def forward(self, x):
        h = super().forward(x)
        ACTS.append(h.detach() * 2)
        return h
class M_GlobalActs(_Model):
    block = B_GlobalActs
    def forward(self, x):
        ACTS.clear()
        return super().forward(x)

class B_ClsLast(_Block):
    def forward(self, x):
        h = super().forward(x)
        type(self).last = h.detach() * 2
        return h
class M_ClsLast(_Model):
    block = B_ClsLast

class B_ClsLastNoIdx(B_ClsLast):
    def __init__(self, d, index=0):
        super().__init__(d, index); del self.layer_idx
class M_ClsLastNoIdx(_Model):
    block = B_ClsLastNoIdx
