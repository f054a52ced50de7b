import dataclasses
import enum
import functools
import types

from tests.test_fold_declines import _Block, _Model


class B_NS(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.opts = types.SimpleNamespace(extra=index > 8)
    def forward(self, x):
        h = super().forward(x)
        if self.opts.extra:
            h = h + self.extra(h)
        return h
class M_NS(_Model):
    block = B_NS

class B_DictOpt(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.opts = {"extra": index > 8}
    def forward(self, x):
        h = super().forward(x)
        if self.opts["extra"]:
            h = h + self.extra(h)
        return h
class M_DictOpt(_Model):
    block = B_DictOpt

@dataclasses.dataclass(frozen=True)
class Opt:
    extra: bool
class B_DC(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.opts = (Opt(index > 8),)
    def forward(self, x):
        h = super().forward(x)
        if self.opts[0].extra:
            h = h + self.extra(h)
        return h
class M_DC(_Model):
    block = B_DC

def _make(k):
    def f(h, lin):
        return h + lin(h) if k > 8 else h
    return f
class B_Closure(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.post = _make(index)
    def forward(self, x):
        return self.post(super().forward(x), self.extra)
class M_Closure(_Model):
    block = B_Closure

def _post(h, lin, k):
    return h + lin(h) if k > 8 else h
class B_Partial(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.post = functools.partial(_post, k=index)
    def forward(self, x):
        return self.post(super().forward(x), self.extra)
class M_Partial(_Model):
    block = B_Partial

class Kind(enum.Enum):
    DENSE = 0
    WIDE = 1
class B_Enum(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.kind = Kind.WIDE if index > 8 else Kind.DENSE
    def forward(self, x):
        h = super().forward(x)
        if self.kind is Kind.WIDE:
            h = h + self.extra(h)
        return h
class M_Enum(_Model):
    block = B_Enum

class B_Default(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.post = lambda h, k=index: h * 2 + 1 if k > 8 else h
    def forward(self, x):
        return self.post(super().forward(x))
class M_LambdaDefault(_Model):
    block = B_Default
