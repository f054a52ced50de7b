"""Values the app reads back from its settings (QSettings), taken whatever they hold: a stale, hand-edited or
hostile value (a number, a list, deep JSON where a configuration belongs) is None, never a crash at start."""

from __future__ import annotations

from engine.config.train_config import TrainConfig
from engine.core.bounded_read import parse_json
from engine.core.errors import UserError

MAX_CONFIG_CHARS = 1 << 16  # a configuration's JSON is a few hundred characters


def stored_config(value: object) -> TrainConfig | None:
    """The training configuration a settings value holds (its JSON text), or None when it holds none."""
    if not isinstance(value, str) or not value or len(value) > MAX_CONFIG_CHARS:
        return None
    try:
        data = parse_json(value, "settings: config")
        if not isinstance(data, dict):
            return None
        return TrainConfig.from_json(data)
    except (UserError, ValueError, TypeError, AttributeError, OverflowError):
        return None  # a value this version does not take: the defaults stay
