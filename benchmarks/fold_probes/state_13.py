from tests.test_fold_declines import _Block, _Model


def _scale_hook(mod, args):
    return (args[0] * 2,)
class B_HookNext(_Block):
    def __init__(self, d, index=0):
        super().__init__(d, index); self._next = []
    def forward(self, x):
        for nb in self._next:
            if not nb._forward_pre_hooks:
                nb.register_forward_pre_hook(_scale_hook)
        return super().forward(x)
_SINK = [B_HookNext(32)]
class M_HookNext(_Model):
    block = B_HookNext
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        bl = list(self.blocks._modules.values())
        for a, b in zip(bl, bl[1:] + _SINK):
            a._next.append(b)

class B_HookCount(_Block):
    """every block registers one more hook on the next block each call: hooks grow per block index"""
    def __init__(self, d, index=0):
        super().__init__(d, index); self._next = []
    def forward(self, x):
        for nb in self._next:
            for _ in range(len(self._forward_pre_hooks) + 1 - len(nb._forward_pre_hooks)):
                nb.register_forward_pre_hook(_scale_hook)
        return super().forward(x)
_SINK2 = [B_HookCount(32)]
class M_HookCount(_Model):
    block = B_HookCount
    def __init__(self, layers=12, d=32):
        super().__init__(layers, d)
        bl = list(self.blocks._modules.values())
        for a, b in zip(bl, bl[1:] + _SINK2):
            a._next.append(b)
