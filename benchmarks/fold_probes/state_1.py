import builtins
import os
import sys

from tests.test_fold_declines import _Block, _Model


class B_TypeCls(_Block):
    calls = 0
    def forward(self, x):
        type(self).calls += 1
        h = super().forward(x)
        if type(self).calls % 4 == 0:
            h = h + self.extra(h)
        return h
class M_TypeCls(_Model):
    block = B_TypeCls
    def forward(self, x):
        B_TypeCls.calls = 0
        return super().forward(x)

class B_DunderCls(_Block):
    n = 0
    def forward(self, x):
        self.__class__.n += 1
        h = super().forward(x)
        if self.__class__.n % 4 == 0:
            h = h + self.extra(h)
        return h
class M_DunderCls(_Model):
    block = B_DunderCls
    def forward(self, x):
        B_DunderCls.n = 0
        return super().forward(x)

LOG = []
class B_Append(_Block):
    def forward(self, x):
        LOG.append(1)
        h = super().forward(x)
        if len(LOG) % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Append(_Model):
    block = B_Append
    def forward(self, x):
        LOG.clear()
        return super().forward(x)

STATE = {}
class B_Update(_Block):
    def forward(self, x):
        STATE.update(n=STATE.get("n", 0) + 1)
        h = super().forward(x)
        if STATE["n"] % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Update(_Model):
    block = B_Update
    def forward(self, x):
        STATE.clear()
        return super().forward(x)

CNT = [0]
def _bump():
    CNT[0] += 1
    return CNT[0]
class B_Helper(_Block):
    def forward(self, x):
        k = _bump()
        h = super().forward(x)
        if k % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Helper(_Model):
    block = B_Helper
    def forward(self, x):
        CNT[0] = 0
        return super().forward(x)

class B_SysMod(_Block):
    def forward(self, x):
        m = sys.modules[__name__]
        m.SM = getattr(m, "SM", 0) + 1
        h = super().forward(x)
        if m.SM % 4 == 0:
            h = h + self.extra(h)
        return h
class M_SysMod(_Model):
    block = B_SysMod
    def forward(self, x):
        sys.modules[__name__].SM = 0
        return super().forward(x)

class B_Setattr(_Block):
    def forward(self, x):
        builtins._probe_n = getattr(builtins, "_probe_n", 0) + 1
        h = super().forward(x)
        if builtins._probe_n % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Setattr(_Model):
    block = B_Setattr
    def forward(self, x):
        builtins._probe_n = 0
        return super().forward(x)

class B_Environ(_Block):
    def forward(self, x):
        n = int(os.environ.get("PROBE_N", "0")) + 1
        os.environ["PROBE_N"] = str(n)
        h = super().forward(x)
        if n % 4 == 0:
            h = h + self.extra(h)
        return h
class M_Environ(_Model):
    block = B_Environ
    def forward(self, x):
        os.environ["PROBE_N"] = "0"
        return super().forward(x)
