import types

from tests.test_fold_declines import _Block, _Model


class B_TensorAttr(_Block):
    def forward(self, x):
        d = getattr(x, "depth", 0)
        h = super().forward(x)
        if d % 4 == 3:
            h = h + self.extra(h)
        h.depth = d + 1
        return h
class M_TensorAttr(_Model):
    block = B_TensorAttr

class B_Ctx(_Block):
    def forward(self, x, ctx):
        ctx.n += 1
        h = super().forward(x)
        if ctx.n % 4 == 0:
            h = h + self.extra(h)
        return h
class M_CtxObj(_Model):
    block = B_Ctx
    def forward(self, x):
        ctx = types.SimpleNamespace(n=0)
        x = self.inp(x)
        for b in self.blocks:
            x = b(x, ctx)
        return self.head(x).sum()

class B_CtxList(_Block):
    def forward(self, x, state):
        state["log"].append(1)
        h = super().forward(x)
        if len(state["log"]) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_CtxDictList(_Model):
    block = B_CtxList
    def forward(self, x):
        state = {"log": []}
        x = self.inp(x)
        for b in self.blocks:
            x = b(x, state=state)
        return self.head(x).sum()

class _Ctx:
    def __init__(self): self.n = 0
class M_CtxOwnClass(_Model):
    block = B_Ctx
    def forward(self, x):
        ctx = _Ctx()
        x = self.inp(x)
        for b in self.blocks:
            x = b(x, ctx)
        return self.head(x).sum()

class B_CtxList2(_Block):
    def forward(self, x, log):
        log.append(1)
        h = super().forward(x)
        if len(log) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_ArgList(_Model):
    block = B_CtxList2
    def forward(self, x):
        log = []
        x = self.inp(x)
        for b in self.blocks:
            x = b(x, log)
        return self.head(x).sum()
