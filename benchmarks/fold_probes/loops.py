"""Models that FOLD and differ from their full trace ((None, False) from tests/test_fold_declines._traces), found
2026-12-04. Run: cd /work/main && PYTHONPATH=. .venv/bin/python /tmp/probeA/run.py wrong_folds"""
import collections
import dataclasses
import enum
import itertools
import random
import types

import numpy as np
import torch
from torch import nn

from tests.test_fold_declines import _Block, _Model

# ---- A. loop-carried state that fold_state.loop_state does not read (it reads only exact int/float/str/bool/None
#         locals, lists/tuples/dicts of those, and public plain attributes of module locals) ----

class M_CountNextTest(_Model):          # an itertools.count local: next(c) in the test
    def forward(self, x):
        x = self.inp(x)
        c = itertools.count()
        for blk in self.blocks:
            x = blk(x)
            if next(c) == 8:
                x = x.detach()
        return self.head(x).sum()

class M_PopFlags(_Model):               # per-block flags taken from an iterator
    def forward(self, x):
        x = self.inp(x)
        flags = iter([False] * 8 + [True] * 4)
        for blk in self.blocks:
            x = blk(x)
            if next(flags):
                x = x.detach()
        return self.head(x).sum()

_N = 0
class M_GlobalInLoop(_Model):           # a global counted in the MODEL's loop (state_reason reads block methods only)
    def forward(self, x):
        global _N
        _N = 0
        x = self.inp(x)
        for blk in self.blocks:
            _N += 1
            x = blk(x)
            if _N > 8:
                x = x.detach()
        return self.head(x).sum()

class M_ClassAttrInLoop(_Model):        # a class attribute (vars(self) does not hold it)
    n = 0
    def forward(self, x):
        type(self).n = 0
        x = self.inp(x)
        for blk in self.blocks:
            type(self).n += 1
            x = blk(x)
            if type(self).n > 8:
                x = x.detach()
        return self.head(x).sum()

class M_UnderscoreAttr(_Model):         # a private attribute of the model (names starting "_" are skipped)
    def forward(self, x):
        self._n = 0
        x = self.inp(x)
        for blk in self.blocks:
            self._n += 1
            x = blk(x)
            if self._n > 8:
                x = x.detach()
        return self.head(x).sum()

class M_HeadAttr(_Model):               # a counter on a submodule that is not a local (self.head)
    def forward(self, x):
        self.head.calls = 0
        x = self.inp(x)
        for blk in self.blocks:
            self.head.calls += 1
            x = blk(x)
            if self.head.calls > 8:
                x = x.detach()
        return self.head(x).sum()

class M_NestedDictInLoop(_Model):       # a dict inside a dict on the model
    def forward(self, x):
        self.st = {"c": {"n": 0}}
        x = self.inp(x)
        for blk in self.blocks:
            self.st["c"]["n"] += 1
            x = blk(x)
            if self.st["c"]["n"] > 8:
                x = x.detach()
        return self.head(x).sum()

class M_NamespaceLocal(_Model):         # a SimpleNamespace local
    def forward(self, x):
        st = types.SimpleNamespace(n=0)
        x = self.inp(x)
        for blk in self.blocks:
            st.n += 1
            x = blk(x)
            if st.n > 8:
                x = x.detach()
        return self.head(x).sum()

class M_DequeInLoop(_Model):            # a deque local
    def forward(self, x):
        q = collections.deque([0])
        x = self.inp(x)
        for blk in self.blocks:
            q.append(q[-1] + 1)
            x = blk(x)
            if q[-1] > 8:
                x = x.detach()
        return self.head(x).sum()

class M_SetCounter(_Model):             # a set local, its length tested
    def forward(self, x):
        x = self.inp(x)
        seen = set()
        for blk in self.blocks:
            seen.add(id(blk))
            x = blk(x)
            if len(seen) > 8:
                x = x.detach()
        return self.head(x).sum()

class M_NumpyInt(_Model):               # np.int64 counter (type(v) in _SCALARS is exact)
    def forward(self, x):
        n = np.int64(0)
        x = self.inp(x)
        for blk in self.blocks:
            n += 1
            x = blk(x)
            if n > 8:
                x = x.detach()
        return self.head(x).sum()

class M_NoneFlags(_Model):              # None entries are left out of a list's signature
    def forward(self, x):
        flags = [None] * 8 + [True] * 4
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
            if flags.pop(0):
                x = x.detach()
        return self.head(x).sum()

class _Stop(Exception):
    pass

class M_ExceptionStop(_Model):          # a budget in a nested list; raise ends the loop (raise is not checked like break)
    def forward(self, x):
        x = self.inp(x)
        budget = [[12 * 3]]
        try:
            for blk in self.blocks:
                x = blk(x)
                budget[0][0] -= 4
                if budget[0][0] < 0:
                    raise _Stop
        except _Stop:
            pass
        return self.head(x).sum()

class M_LayerDropSeed5(_Model):         # LayerDrop with a seeded random.Random local (blocks 6 and 11 dropped)
    def forward(self, x):
        rng = random.Random(5)
        x = self.inp(x)
        for blk in self.blocks:
            if rng.random() < 0.2:
                continue
            x = blk(x)
        return self.head(x).sum()

class M_Callback(_Model):               # the count lives in a closure the loop calls (a function local)
    def _run(self, x, cb):
        for blk in self.blocks:
            x = blk(x)
            if cb():
                x = x.detach()
        return x
    def forward(self, x):
        n = [0]
        def cb():
            n[0] += 1
            return n[0] > 8
        return self.head(self._run(self.inp(x), cb)).sum()

class M_StatsNS(_Model):                # the model's method counts in an object the model holds
    def __init__(self):
        super().__init__()
        self.stats = types.SimpleNamespace(count=0)
    def tick(self):
        self.stats.count += 1
        return self.stats.count
    def forward(self, x):
        self.stats.count = 0
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
            if self.tick() > 8:
                x = x.detach()
        return self.head(x).sum()

class M_RunnerObj(_Model):              # a plain (non-Module) runner object counts on itself in its own loop
    class Runner:
        def __init__(self):
            self.n = 0
        def __call__(self, blocks, x):
            self.n = 0
            for b in blocks:
                self.n += 1
                x = b(x)
                if self.n > 8:
                    x = x.detach()
            return x
    def __init__(self):
        super().__init__()
        self.runner = M_RunnerObj.Runner()
    def forward(self, x):
        return self.head(self.runner(self.blocks, self.inp(x))).sum()

# ---- B. the stack gone through by a generator of the model's: the CONSUMER's loop is never read ----

class M_GenConsumerBreak(_Model):
    def gen(self):
        for b in self.blocks:
            yield b
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.gen()):
            if i == 8:
                break
            x = blk(x)
        return self.head(x).sum()

class M_GenConsumerCount(_Model):
    def gen(self):
        for b in self.blocks:
            yield b
    def forward(self, x):
        x = self.inp(x)
        n = 0
        for blk in self.gen():
            n += 1
            x = blk(x)
            if n > 8:
                x = x.detach()
        return self.head(x).sum()

class M_GenConsumerIndexAfter(_Model):
    def gen(self):
        for b in self.blocks:
            yield b
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.gen()):
            x = blk(x)
        return self.head(x).sum() + x.new_zeros(i + 1).sum()

# ---- C. what the loop indexes by `i`, compared only by class or not at all (fold_state.indexed_reason) ----

class M_FuncList(_Model):               # a list of functions: entries by class ("builtin_function_or_method")
    def __init__(self):
        super().__init__()
        self.acts = [torch.relu] * 8 + [torch.tanh] * 4
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = self.acts[i](blk(x))
        return self.head(x).sum()

class M_ParallelMixedML(_Model):        # a parallel ModuleList of other classes (held is a ModuleList, not a list)
    def __init__(self):
        super().__init__()
        self.post = nn.ModuleList([nn.Identity() for _ in range(8)] + [nn.Tanh() for _ in range(4)])
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = self.post[i](blk(x))
        return self.head(x).sum()

class Kind(enum.Enum):
    LOCAL = 1
    GLOBAL = 2

def post(x, kind):
    if kind is Kind.GLOBAL:
        x = torch.tanh(x)
    return x

def post_s(x, c):
    if c == "*":
        x = torch.tanh(x)
    return x

class M_EnumListHelper(_Model):         # per-layer Enum kinds, handed to a helper (entries by class "Kind")
    def __init__(self):
        super().__init__()
        self.kinds = [Kind.LOCAL] * 8 + [Kind.GLOBAL] * 4
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = post(blk(x), self.kinds[i])
        return self.head(x).sum()

class M_PatternStrHelper(_Model):       # a layer-pattern string (Nemotron-H/Jamba style): a str is not read at all
    def __init__(self):
        super().__init__()
        self.pattern = "MMMMMMMM*M*M"
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = post_s(blk(x), self.pattern[i])
        return self.head(x).sum()

class M_NumpyHelper(_Model):            # a numpy array of widths: not a list/tuple/dict, not read
    def __init__(self):
        super().__init__()
        self.w = np.array([1] * 8 + [16] * 4)
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            x = x + x.new_zeros(int(self.w[i]))[:1]
        return self.head(x).sum()

class M_ObjListAlloc(_Model):           # per-layer config objects: entries by class
    def __init__(self):
        super().__init__()
        self.cfg = [types.SimpleNamespace(w=1) for _ in range(8)] + [types.SimpleNamespace(w=64) for _ in range(4)]
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            x = x + x.new_zeros(self.cfg[i].w)[:1]
        return self.head(x).sum()

class M_TupleOfTuplesNested(_Model):    # [[{"w": ..}]] per layer: inner containers left out of the signature
    def __init__(self):
        super().__init__()
        self.cfg = [[{"w": 1}]] * 8 + [[{"w": 64}]] * 4
    def forward(self, x):
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            x = x + x.new_zeros(self.cfg[i][0]["w"])[:1]
        return self.head(x).sum()

# ---- D. a block's non-plain argument carries its depth (fold_state.ArgWatch shows any object as "…") ----

@dataclasses.dataclass
class Ctx:
    layer: int
    total: int

class _CtxBlock(_Block):
    def forward(self, x, ctx):
        h = super().forward(x)
        if ctx.layer >= ctx.total - 4:
            h = h + self.extra(h)
        return h

class M_CtxArg(_Model):                 # one ctx object mutated by the loop
    block = _CtxBlock
    def forward(self, x):
        x = self.inp(x)
        ctx = Ctx(0, 12)
        for blk in self.blocks:
            x = blk(x, ctx)
            ctx.layer += 1
        return self.head(x).sum()

class M_CtxArgNew(_Model):              # a new ctx object per block
    block = _CtxBlock
    def forward(self, x):
        x = self.inp(x)
        c = itertools.count()
        for blk in self.blocks:
            x = blk(x, Ctx(next(c), 12))
        return self.head(x).sum()

# ---- E. which block it is, by identity (fold_index watches only index attributes) ----

_DEPTH = {}

class _GlobalLookupBlock(_Block):
    def forward(self, x):
        h = super().forward(x)
        if _DEPTH[id(self)] >= 8:
            h = h + self.extra(h)
        return h

class M_BlockGlobalLookup(_Model):      # the block looks its depth up in a global dict by id(self)
    block = _GlobalLookupBlock
    def __init__(self):
        super().__init__()
        _DEPTH.clear()
        _DEPTH.update({id(b): i for i, b in enumerate(self.blocks)})

class M_HelperMethodIdentity(_Model):   # a model method looks the block's depth up by id(blk)
    def __init__(self):
        super().__init__()
        self._depth = {id(b): i for i, b in enumerate(self.blocks)}
    def _apply(self, blk, x):
        x = blk(x)
        if self._depth[id(blk)] >= 8:
            x = x.detach()
        return x
    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            x = self._apply(blk, x)
        return self.head(x).sum()

class _LastFlagBlock(_Block):
    def forward(self, x, last=False):
        h = super().forward(x)
        if last:
            h = h + self.extra(h)
        return h

class M_LastByIdentityHelper(_Model):   # `blk is self._last[0]` in a helper method (not in the loop's body)
    block = _LastFlagBlock
    def __init__(self):
        super().__init__()
        self._last = [self.blocks[-1]]
    def _call(self, blk, x):
        return blk(x, last=blk is self._last[0])
    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            x = self._call(blk, x)
        return self.head(x).sum()

# ---- F. a per-block tensor of the same size but another dtype (fold_reads compares sizes only) ----

class _WithE(_Block):
    def forward(self, x, e):
        return super().forward(x) + e.float().sum(-1, keepdim=True)

class M_DtypePerBlock(_Model):
    block = _WithE
    def forward(self, x):
        x = self.inp(x)
        extra = iter([x.new_zeros(*x.shape[:-1], 8) for i in range(8)] +
                     [x.new_zeros(*x.shape[:-1], 8, dtype=torch.int32) for i in range(4)])
        for blk in self.blocks:
            x = blk(x, next(extra))
        return self.head(x).sum()
