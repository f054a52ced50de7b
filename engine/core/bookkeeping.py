"""The engine's own bookkeeping inside a traced step, out of sight of torch-function modes.

Between the model's ops the engine reads and writes tensors of its own accord: each parameter's gradient tracked
after a backward, a fold's blocks written out (engine.trace.folded_trace), an optimizer made over the parameters.
No op of the model's runs there, so no torch-function mode needs to see those reads; a CUDA target's
(engine.cuda.target.CudaKernelChoices) saw each `p.grad` of them: on an 80-layer Llama-shaped model about 10,700 calls
of its Python handler per estimate, about 30 ms (benchmarks/depth_stages.py). Dispatch modes (the recorder, the
fake tensors) still see every op made inside, as before.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch


def bookkeeping() -> AbstractContextManager[None]:
    """A context in which torch-function modes and subclasses' __torch_function__ do not run (torch's own
    DisableTorchFunction); for the engine's code only, never around the model's."""
    return torch._C.DisableTorchFunction()
