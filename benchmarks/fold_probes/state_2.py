import itertools
import random
import weakref

from torch import nn

from tests.test_fold_declines import _Block, _Model


# 1. shared LayerNorm every block holds, its plain attribute counted by the block
class B_SharedNormAttr(_Block):
    def __init__(self, d, index=0, norm=None):
        super().__init__(d, index)
        self.norm = norm
    def forward(self, x):
        self.norm.calls += 1
        h = super().forward(self.norm(x))
        if self.norm.calls % 4 == 0:
            h = h + self.extra(h)
        return h
class M_SharedNormAttr(_Model):
    def __init__(self, layers=12, d=32):
        nn.Module.__init__(self)
        self.inp = nn.Linear(d, d)
        norm = nn.LayerNorm(d); norm.calls = 0
        self.blocks = nn.ModuleList(B_SharedNormAttr(d, i, norm) for i in range(layers))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        self.blocks[0].norm.calls = 0
        return super().forward(x)

# 2. shared module whose own forward counts
class CountingNorm(nn.LayerNorm):
    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        y = super().forward(x)
        if self.calls % 4 == 0:
            y = y * 2 + 1
        return y
class B_SharedCounting(_Block):
    def __init__(self, d, index=0, norm=None):
        super().__init__(d, index)
        self.norm = norm
    def forward(self, x):
        return super().forward(self.norm(x))
class M_SharedCounting(_Model):
    def __init__(self, layers=12, d=32):
        nn.Module.__init__(self)
        self.inp = nn.Linear(d, d)
        norm = CountingNorm(d)
        self.blocks = nn.ModuleList(B_SharedCounting(d, i, norm) for i in range(layers))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        self.blocks[0].norm.calls = 0
        return super().forward(x)

# 3. random layer drop (Python random seeded each step)
class B_LayerDrop(_Block):
    def forward(self, x):
        if random.random() < 0.5:
            return x
        return super().forward(x)
class M_LayerDrop(_Model):
    block = B_LayerDrop
    def forward(self, x):
        random.seed(0)
        return super().forward(x)

# 4. itertools.cycle pattern
_PATTERN = [None]
class B_Cycle(_Block):
    def forward(self, x):
        kind = next(_PATTERN[0])
        h = super().forward(x)
        if kind:
            h = h + self.extra(h)
        return h
class M_Cycle(_Model):
    block = B_Cycle
    def forward(self, x):
        _PATTERN[0] = itertools.cycle([0, 0, 0, 1])
        return super().forward(x)

# 5. itertools.count as global id source
_IDS = [None]
class B_Count(_Block):
    def forward(self, x):
        k = next(_IDS[0])
        h = super().forward(x)
        if k % 4 == 3:
            h = h + self.extra(h)
        return h
class M_Count(_Model):
    block = B_Count
    def forward(self, x):
        _IDS[0] = itertools.count()
        return super().forward(x)

# 6. block modifies the next block (depth propagated through a hidden list)
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
class M_Next(_Model):
    block = B_Next
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        for a, b in zip(self.blocks, list(self.blocks)[1:]):
            a._next.append(b)
    def forward(self, x):
        for b in self.blocks._modules.values():
            b.depth = 0
        return super().forward(x)

# 7. shared list under a private attribute name
class B_PrivList(_Block):
    def __init__(self, d, index=0, log=None):
        super().__init__(d, index)
        self._log = log
    def forward(self, x):
        self._log.append(1)
        h = super().forward(x)
        if len(self._log) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_PrivList(_Model):
    def __init__(self, layers=12, d=32):
        nn.Module.__init__(self)
        self.inp = nn.Linear(d, d)
        log = []
        self.blocks = nn.ModuleList(B_PrivList(d, i, log) for i in range(layers))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        self.blocks[0]._log.clear()
        return super().forward(x)

# 8. weakref to the model, count on the model
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
class M_Parent(_Model):
    block = B_Parent
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        for b in self.blocks:
            b.parent = weakref.ref(self)
    def forward(self, x):
        self.seen = 0
        return super().forward(x)

# 9. a global counter object with a method
class _Counter:
    def __init__(self): self.n = 0
    def tick(self):
        self.n += 1
        return self.n
_CTR = _Counter()
class B_CtrObj(_Block):
    def forward(self, x):
        k = _CTR.tick()
        h = super().forward(x)
        if k % 4 == 0:
            h = h + self.extra(h)
        return h
class M_CtrObj(_Model):
    block = B_CtrObj
    def forward(self, x):
        _CTR.n = 0
        return super().forward(x)

# 10. property computing from a shared counter via class attribute
class B_Prop(_Block):
    _count = [0]
    @property
    def phase(self):
        self._count.append(0)
        return len(self._count) % 4
    def forward(self, x):
        h = super().forward(x)
        if self.phase == 0:
            h = h + self.extra(h)
        return h
class M_Prop(_Model):
    block = B_Prop
    def forward(self, x):
        B_Prop._count[:] = []
        return super().forward(x)
