"""engine.trace.fold_loops: which loops over a stack keep it from folding (the source read, no trace)."""

from __future__ import annotations

import torch
from torch import nn

from engine.trace.fold_loops import loop_reason


class _Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(8))


class _Plain(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[: len(self.layers)]:
            x = layer(x)
        return x


class _CachePerLayer(_Base):
    def forward(self, x: torch.Tensor, caches: list[torch.Tensor]) -> torch.Tensor:
        hidden: tuple[torch.Tensor, ...] = ()
        for i, layer in enumerate(self.layers):
            hidden += (x,)
            x = layer(x) + caches[i]
            for _ in range(2):
                if x.shape[0] > 1:
                    break  # an inner loop's break ends the inner loop only
        return x


class _Break(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i == 5:
                break
            x = layer(x)
        return x


class _Return(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
            if x.shape[-1] == 4:
                return x
        return x


class _IndexToBlock(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) * (i + 1)
        return x


class _CountedIndexTest(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(self.layers)):
            x = self.layers[i](x)
            x = x.detach() if i % 3 == 0 else x
        return x


class _BlockTest(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if layer.in_features in (4, 8):
                x = layer(x)
        return x


class _Alias(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stack = self.layers
        for k, layer in enumerate(stack):
            if k > 6:
                x = layer(x)
        return x


class _InAHelper(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_layers(x)

    def run_layers(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in zip(range(100), self.layers, strict=False):
            x = layer(x) if i != 3 else x
        return x


class _ByPosition(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return x + outs[4]


class _HiddenTuple(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: tuple[torch.Tensor, ...] = ()
        for layer in self.layers:
            hidden += (x,)
            x = layer(x)
        return x + hidden[3]


class _FromTheEnd(_Base):
    """The last outputs by their place from the end, and a tensor summed in place then sliced: fine."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for layer in self.layers:
            x += layer(x)
            outs.append(x)
        return outs[-1] + outs[-2] + x[:, 0]


class _Overrides(_Break):
    """Its own forward hides _Break's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Outer(nn.Module):
    """The loop over a submodule's stack, in the model above it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _Base()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.body.layers):
            if i == 2:
                continue
            x = layer(x)
        return x


def _made_at_run_time() -> type[nn.Module]:
    namespace: dict[str, object] = {"nn": nn, "__name__": "notebook_cell"}
    exec("class Made(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(8))\n"
         "    def forward(self, x):\n"
         "        for layer in self.layers:\n"
         "            x = layer(x)\n"
         "        return x\n", namespace)
    made = namespace["Made"]
    assert isinstance(made, type) and issubclass(made, nn.Module)
    return made


def test_loops_that_only_run_the_blocks_or_index_by_the_loop_pass() -> None:
    for model in (_Plain(), _CachePerLayer(), _Overrides(), _FromTheEnd()):
        assert loop_reason(model, "layers") is None, type(model).__name__


def test_loops_that_act_on_the_block_they_are_at_say_how() -> None:
    cases = {
        _Break: "_Break.forward: its loop over layers (line 38) breaks out of it",
        _Return: "_Return.forward: its loop over layers (line 47) returns from inside it",
        _IndexToBlock: "uses the block's index `i` (line 57)",
        _CountedIndexTest: "uses the block's index `i` (line 65)",
        _BlockTest: "tests the block `layer` (line 72)",
        _Alias: "uses the block's index `k` (line 81)",
        _InAHelper: "_InAHelper.run_layers: its loop over layers",
        _ByPosition: "keeps each block's output in `outs` and takes one by its position (line 102)",
        _HiddenTuple: "keeps each block's output in `hidden` and takes one by its position (line 111)",
    }
    for cls, why in cases.items():
        reason = loop_reason(cls(), "layers")
        assert reason is not None and why in reason, (cls.__name__, reason)


def test_a_loop_in_the_model_above_the_stacks_owner_is_read() -> None:
    reason = loop_reason(_Outer(), "body.layers")
    assert reason is not None and "_Outer.forward" in reason and "`i`" in reason


def test_a_method_whose_source_cannot_be_read_is_a_reason() -> None:
    reason = loop_reason(_made_at_run_time()(), "layers")
    assert reason == "the source of Made.forward, which uses layers, cannot be read"
