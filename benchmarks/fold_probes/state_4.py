import functools
import os

import torch

from tests.test_fold_declines import _Block, _Model


class B_TypeIs(_Block):
    def forward(self, x):
        h = super().forward(x)
        if type(self) is B_TypeIs:
            h = h + self.extra(h)
        return h
class M_TypeIs(_Model):
    block = B_TypeIs

_REG = {}
class B_Registry(_Block):
    def forward(self, x):
        h = super().forward(x)
        if type(self) in _REG:
            h = h + self.extra(h)
        return h
_REG[B_Registry] = True
class M_Registry(_Model):
    block = B_Registry

class B_MutDefault(_Block):
    def forward(self, x, _seen=[]):
        _seen.append(1)
        h = super().forward(x)
        if len(_seen) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_MutDefault(_Model):
    block = B_MutDefault
    def forward(self, x):
        B_MutDefault.forward.__defaults__[0].clear()
        return super().forward(x)

def counted(fn):
    n = 0
    @functools.wraps(fn)
    def wrapper(self, x):
        nonlocal n
        n += 1
        y = fn(self, x)
        if n % 4 == 0:
            y = y + self.extra(y)
        return y
    wrapper.reset = lambda: None
    return wrapper
_RESET = []
def counted2(fn):
    st = {"n": 0}
    _RESET.append(st)
    @functools.wraps(fn)
    def wrapper(self, x):
        st["n"] += 1
        y = fn(self, x)
        if st["n"] % 4 == 0:
            y = y + self.extra(y)
        return y
    return wrapper
class B_Decorated(_Block):
    @counted2
    def forward(self, x):
        return super().forward(x)
class M_Decorated(_Model):
    block = B_Decorated
    def forward(self, x):
        for s in _RESET: s["n"] = 0
        return super().forward(x)

class _Phase:
    def __init__(self): self.n = 0
    def __get__(self, obj, owner):
        if obj is None: return self
        self.n += 1
        return self.n % 4
class B_Descr(_Block):
    phase = _Phase()
    def forward(self, x):
        h = super().forward(x)
        if self.phase == 0:
            h = h + self.extra(h)
        return h
class M_Descr(_Model):
    block = B_Descr
    def forward(self, x):
        B_Descr.__dict__["phase"].n = 0
        return super().forward(x)

class B_GradToggle(_Block):
    def forward(self, x):
        h = super().forward(x)
        torch.set_grad_enabled(not torch.is_grad_enabled())
        return h
class M_GradToggle(_Model):
    block = B_GradToggle
    def forward(self, x):
        with torch.enable_grad():
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
        torch.set_grad_enabled(True)
        return self.head(x).sum()

FEATS = []
class B_Feats(_Block):
    def forward(self, x):
        h = super().forward(x)
        FEATS.append(1)
        return h
class M_FeatsLen(_Model):
    block = B_Feats
    def forward(self, x):
        FEATS.clear()
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        w = x.new_ones(len(FEATS), x.shape[-1]).sum(0)
        return self.head(x * w).sum()

class B_GetAttr(_Block):
    _hits = [0]
    def __getattr__(self, name):
        if name == "gate":
            self._hits[0] += 1
            return self._hits[0] % 4 == 0
        return super().__getattr__(name)
    def forward(self, x):
        h = super().forward(x)
        if self.gate:
            h = h + self.extra(h)
        return h
class M_GetAttr(_Model):
    block = B_GetAttr
    def forward(self, x):
        B_GetAttr._hits[0] = 0
        return super().forward(x)

class B_EnvUpdate(_Block):
    def forward(self, x):
        n = int(os.environ.get("PROBE_M", "0")) + 1
        os.environ.update(PROBE_M=str(n))
        h = super().forward(x)
        if n % 4 == 0:
            h = h + self.extra(h)
        return h
class M_EnvUpdate(_Model):
    block = B_EnvUpdate
    def forward(self, x):
        os.environ["PROBE_M"] = "0"
        return super().forward(x)
