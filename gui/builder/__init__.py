"""The model builder: palette, canvas and inspector editing an engine Sketch (see widget.BuilderWidget)."""

from .widget import BuilderWidget

__all__ = ["BuilderWidget"]
