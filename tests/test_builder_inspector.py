"""The inspector on the offscreen platform: editing a field through its widget changes the sketch and announces
it; a value the catalogue refuses stays at the field with the reason and the sketch is untouched. Figures are
checked against torch's own modules."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit  # noqa: E402
from torch import nn  # noqa: E402

from engine.sketch.document import Sketch  # noqa: E402


@pytest.fixture
def builder(qtbot, tmp_path):
    from gui.builder import BuilderWidget

    w = BuilderWidget(autosave_dir=tmp_path / "autosave", autosave_interval_s=0)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    qtbot.waitExposed(w)
    s = Sketch("mlp")
    s.add_node("Input", {"shape": (784,)}, 0, 0, id="inp")
    s.add_node("Linear", {"out_features": 10}, 0, 200, id="fc")
    s.add_node("GELU", None, 0, 400, id="act")
    s.connect("inp", "fc")
    s.connect("fc", "act")
    w.set_sketch(s)
    return w


def type_into(qtbot, editor: QLineEdit, text: str) -> None:
    editor.setFocus()
    editor.selectAll()
    qtbot.keyClicks(editor, text)
    qtbot.keyClick(editor, Qt.Key.Key_Return)


def test_editing_a_field_updates_the_sketch_and_announces_it(builder, qtbot):
    builder.select_node("fc")
    ins = builder.inspector()
    assert ins.node_id() == "fc"
    editor = ins.editor("out_features")
    assert isinstance(editor, QLineEdit) and editor.text() == "10"
    with qtbot.waitSignal(builder.sketchChanged, timeout=2000) as changed:
        type_into(qtbot, editor, "64")
    sk = changed.args[0]
    assert sk.nodes["fc"].fields["out_features"] == 64
    r = builder.shapes()["fc"]
    ref = nn.Linear(784, 64)
    assert r.shape == (64,) and r.params == sum(p.numel() for p in ref.parameters())
    assert "Output <tt>(B, 64)</tt>" in ins.info.text()
    assert builder.canvas().scene_().nodes["fc"].shape_ == (64,)
    assert builder.undo_stack().count() == 1


def test_an_invalid_value_is_refused_at_the_field_with_the_reason(builder, qtbot):
    builder.select_node("fc")
    ins = builder.inspector()
    before = builder.sketch().to_json()
    seen = []
    builder.sketchChanged.connect(seen.append)
    type_into(qtbot, ins.editor("out_features"), "-5")
    assert ins.error_text("out_features") == "out_features must be ≥ 1"
    assert "d32f2f" in ins.editor("out_features").styleSheet()  # the field itself is marked
    type_into(qtbot, ins.editor("out_features"), "ten")
    assert "whole number" in ins.error_text("out_features")
    assert builder.sketch().to_json() == before and not seen and builder.undo_stack().count() == 0
    # A good value clears the mark.
    type_into(qtbot, ins.editor("out_features"), "32")
    assert ins.error_text("out_features") == "" and builder.sketch().nodes["fc"].fields["out_features"] == 32


def test_tuple_bool_and_choice_fields(builder, qtbot):
    ins = builder.inspector()
    builder.select_node("inp")
    type_into(qtbot, ins.editor("shape"), "3, 28, 28")
    assert builder.sketch().nodes["inp"].fields["shape"] == (3, 28, 28)
    assert ins.editor("shape").text() == "3, 28, 28"
    type_into(qtbot, ins.editor("shape"), "784")
    builder.select_node("fc")
    bias = ins.editor("bias")
    assert isinstance(bias, QCheckBox) and bias.isChecked()
    bias.setChecked(False)
    assert builder.sketch().nodes["fc"].fields["bias"] is False
    # Linear(784, 10) without bias: 7840 weights.
    assert builder.shapes()["fc"].params == sum(p.numel() for p in nn.Linear(784, 10, bias=False).parameters())
    builder.select_node("act")
    box = ins.editor("approximate")
    assert isinstance(box, QComboBox)
    box.setCurrentText("tanh")
    box.activated.emit(box.currentIndex())
    assert builder.sketch().nodes["act"].fields["approximate"] == "tanh"
    st = builder.undo_stack()
    assert st.count() == 4
    while st.canUndo():
        st.undo()
    assert builder.sketch().nodes["act"].fields["approximate"] == "none"
    assert builder.sketch().nodes["fc"].fields["bias"] is True
    assert builder.sketch().nodes["inp"].fields["shape"] == (784,)
    builder.select_node("fc")
    assert ins.editor("bias").isChecked()  # the inspector follows undo


def test_read_only_sketch_cannot_be_edited(builder):
    sk = builder.sketch().copy()
    builder.set_sketch(sk, read_only=True)
    builder.select_node("fc")
    ins = builder.inspector()
    assert not ins.editor("out_features").isEnabled()
    assert not builder.palette().isEnabled()
    assert builder.canvas().handle_drop("ReLU", builder.canvas().mapToScene(10, 10)) is None
    assert not ins.commit("out_features", "12")
    assert builder.sketch().nodes["fc"].fields["out_features"] == 10
