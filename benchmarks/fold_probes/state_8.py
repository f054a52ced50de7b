from tests.test_fold_declines import _Block, _Model

CNT = [0]
class B_Static(_Block):
    @staticmethod
    def _tick():
        CNT[0] += 1
        return CNT[0]
    def forward(self, x):
        h = super().forward(x)
        if self._tick() % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Static(_Model):
    block = B_Static
    def forward(self, x):
        CNT[0] = 0
        return super().forward(x)

class B_ClsMethod(_Block):
    n = 0
    @classmethod
    def _tick(cls):
        cls.n += 1
        return cls.n
    def forward(self, x):
        h = super().forward(x)
        if self._tick() % 4 == 0:
            h = h + self.extra(h)
        return h
class M_ClsMethod(_Model):
    block = B_ClsMethod
    def forward(self, x):
        B_ClsMethod.n = 0
        return super().forward(x)

CNT2 = [0]
class B_PropStore(_Block):
    @property
    def gate(self):
        CNT2[0] += 1
        return CNT2[0] % 4 == 0
    def forward(self, x):
        h = super().forward(x)
        if self.gate:
            h = h + self.extra(h)
        return h
class M_PropStore(_Model):
    block = B_PropStore
    def forward(self, x):
        CNT2[0] = 0
        return super().forward(x)

CNT3 = [0]
class B_Alias(_Block):
    def forward(self, x):
        c = CNT3
        c[0] += 1
        h = super().forward(x)
        if c[0] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Alias(_Model):
    block = B_Alias
    def forward(self, x):
        CNT3[0] = 0
        return super().forward(x)

CNT4 = {"n": 0}
def _inc(d):
    d["n"] += 1
class B_PassGlobal(_Block):
    def forward(self, x):
        _inc(CNT4)
        h = super().forward(x)
        if CNT4["n"] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_PassGlobal(_Model):
    block = B_PassGlobal
    def forward(self, x):
        CNT4["n"] = 0
        return super().forward(x)

# functools.partial-wrapped forward? a method assigned from a module-level function
CNT5 = [0]
def _fwd(self, x):
    CNT5[0] += 1
    h = _Block.forward(self, x)
    if CNT5[0] % 4 == 0:
        h = h + self.extra(h)
    return h
class B_Assigned(_Block):
    forward = _fwd
class M_Assigned(_Model):
    block = B_Assigned
    def forward(self, x):
        CNT5[0] = 0
        return super().forward(x)

CNT6 = [0]
class B_Partialmethod(_Block):
    def _fwd(self, x, k):
        CNT6[0] += k
        h = _Block.forward(self, x)
        if CNT6[0] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Partialmethod(_Model):
    block = B_Partialmethod
    def forward(self, x):
        CNT6[0] = 0
        return super().forward(x)
