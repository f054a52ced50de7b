import types

from tests.test_fold_declines import _Block, _Model


class B_Set(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.flags = {"extra"} if index > 8 else set()
    def forward(self, x):
        h = super().forward(x)
        if "extra" in self.flags:
            h = h + self.extra(h)
        return h
class M_Set(_Model):
    block = B_Set

class B_NestedNS(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.cfg = types.SimpleNamespace(opts={"extra": index > 8})
    def forward(self, x):
        h = super().forward(x)
        if self.cfg.opts["extra"]:
            h = h + self.extra(h)
        return h
class M_NestedNS(_Model):
    block = B_NestedNS

class B_Deep(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self.cfg = {"a": {"b": [index > 8]}}
    def forward(self, x):
        h = super().forward(x)
        if self.cfg["a"]["b"][0]:
            h = h + self.extra(h)
        return h
class M_Deep(_Model):
    block = B_Deep
