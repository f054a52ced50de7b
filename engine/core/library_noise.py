"""What the optional libraries print that is none of the user's business, silenced where the project imports
them: bitsandbytes' notice that its CPU kernel hub is missing (the tracer runs no kernel), transformers'
deprecation of the name peft still calls, and transformers' notice that a checkpointed model trains without its KV
cache (the estimate says it checkpoints as transformers does). Only those messages, from those libraries: every
other warning shows.
"""

from __future__ import annotations

import logging
import warnings

# logger -> the text of the notice dropped from it
_NOTICES = {
    # bitsandbytes logs this at import (its CPU backend looks for the `kernels` package), once per process.
    "bitsandbytes.backends.cpu.ops": "from kernels-community",
    # transformers, once per process, for a model whose config keeps use_cache on, trained checkpointed
    "transformers.utils.generic": "is incompatible with gradient checkpointing",
    "transformers.modeling_layers": "is incompatible with gradient checkpointing",
}
# peft's get_peft_model reads model.is_gradient_checkpointing, which transformers 5 deprecates.
_PEFT_DEPRECATED = r"`is_gradient_checkpointing` is deprecated"


class _DropNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _NOTICES.get(record.name, "\0") not in record.getMessage()


_FILTER = _DropNotice()


def quiet_libraries() -> None:
    """Call before importing bitsandbytes or peft, or checkpointing a transformers model (idempotent)."""
    for name in _NOTICES:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=_PEFT_DEPRECATED, category=FutureWarning, module=r"transformers\.")
