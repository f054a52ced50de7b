"""Charts painted with QtGui onto any QPainter, shared by the app's widgets (gui.charts) and the report (report/).

No widgets and nothing of gui/: the CLI's report draws these without the app. Colours per memory category
and the light/dark chart themes live in render.colors; the timeline and the breakdown donut in their modules.
"""
