"""What the optional libraries print that is none of the user's business, silenced where the project imports
them: bitsandbytes' notice that its CPU kernel hub is missing (the tracer runs no kernel) and transformers'
deprecation of the name peft still calls. Only those messages, from those libraries: every other warning shows.
"""

from __future__ import annotations

import logging
import warnings

# bitsandbytes logs this at import (its CPU backend looks for the `kernels` package), once per process.
_BNB_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_NOTICE = "from kernels-community"
# peft's get_peft_model reads model.is_gradient_checkpointing, which transformers 5 deprecates.
_PEFT_DEPRECATED = r"`is_gradient_checkpointing` is deprecated"


class _DropNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _BNB_NOTICE not in record.getMessage()


_FILTER = _DropNotice()


def quiet_libraries() -> None:
    """Call before importing bitsandbytes or peft (idempotent)."""
    logger = logging.getLogger(_BNB_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
        warnings.filterwarnings("ignore", message=_PEFT_DEPRECATED, category=FutureWarning, module=r"transformers\.")
