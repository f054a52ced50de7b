"""Every builder edit is one undo step: undo gives back the sketch exactly as it was, redo the edited one, and
sketchChanged fires each time. Each edit kind goes through the same path the user's action takes."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPointF  # noqa: E402

from engine.sketch.document import Sketch  # noqa: E402


@pytest.fixture
def builder(qtbot, tmp_path):
    from gui.builder import BuilderWidget

    w = BuilderWidget(autosave_dir=tmp_path / "autosave", autosave_interval_s=0)
    qtbot.addWidget(w)
    w.resize(1100, 800)
    w.show()
    s = Sketch("net")
    s.add_node("Input", {"shape": (3, 32, 32)}, 0, 0, id="img")
    s.add_node("Conv2d", {"out_channels": 6, "kernel_size": (5,)}, 0, 200, id="conv")
    s.add_node("ReLU", None, 0, 400, id="relu")
    s.add_node("Output", None, 0, 600, id="out")
    s.connect("img", "conv")
    s.connect("conv", "relu")
    s.connect("relu", "out")
    w.set_sketch(s)
    return w


def state(builder) -> dict:
    """The sketch's JSON with connections as a set (their list order carries no meaning; ports do)."""
    d = builder.sketch().to_json()
    d["edges"] = sorted((e["src"], e["dst"], e["port"]) for e in d["edges"])
    return d


def check_undo_redo(builder, edit, text: str) -> dict:
    """Run `edit`, then undo and redo it; return the edited sketch's JSON."""
    st = builder.undo_stack()
    before = state(builder)
    n = st.index()
    seen = []
    builder.sketchChanged.connect(seen.append)
    edit()
    after = state(builder)
    assert after != before, text
    assert st.index() == n + 1 and st.undoText() == text
    st.undo()
    assert state(builder) == before
    st.redo()
    assert state(builder) == after
    assert len(seen) == 3  # edit, undo, redo
    # The same Sketch object throughout, so whoever holds it (the main window) sees every change.
    assert all(s is builder.sketch() for s in seen)
    builder.sketchChanged.disconnect(seen.append)
    return after


def node_ids(builder):
    return set(builder.sketch().nodes)


def test_add_remove_move_and_set_field(builder):
    canvas = builder.canvas()
    check_undo_redo(builder, lambda: canvas.handle_drop("Dropout", QPointF(600, 100)), "Add Dropout")
    builder.select_node("relu")
    check_undo_redo(builder, builder.delete_selected, "Delete 1 layer")
    builder.undo_stack().undo()
    builder.select_node("conv")
    check_undo_redo(builder, lambda: canvas.nudge(24, 0), "Move layer")
    builder.select_node("conv")
    check_undo_redo(builder, lambda: builder.inspector().commit("out_channels", "16"), "Set out_channels")


def test_consecutive_nudges_merge_into_one_step(builder):
    canvas = builder.canvas()
    builder.select_node("conv")
    for _ in range(5):
        canvas.nudge(4, 0)
    st = builder.undo_stack()
    assert st.count() == 1
    assert builder.sketch().nodes["conv"].x == 20
    st.undo()
    assert builder.sketch().nodes["conv"].x == 0


def test_connect_disconnect_and_insert_on_edge(builder):
    from gui.builder import commands as C

    doc = builder.document()
    canvas = builder.canvas()
    key = ("conv", "relu", 0)
    check_undo_redo(builder, lambda: doc.push(C.DisconnectCommand(doc, key)), "Disconnect")
    check_undo_redo(builder, lambda: doc.push(C.ConnectCommand(doc, "conv", "relu")), "Connect")
    mid = canvas.scene_().edges[key].path().pointAtPercent(0.5)
    after = check_undo_redo(builder, lambda: canvas.handle_drop("BatchNorm2d", mid), "Insert BatchNorm2d")
    bn = next(n["id"] for n in after["nodes"] if n["type"] == "BatchNorm2d")
    assert {(e[0], e[1]) for e in after["edges"]} == {("img", "conv"), ("conv", bn), (bn, "relu"),
                                                                ("relu", "out")}
    # LeNet's first block: 3x32x32 through a 5x5 conv to 6 channels gives 6x28x28 (LeCun et al. 1998).
    assert builder.shapes()[bn].shape == (6, 28, 28)


def test_paste_duplicate_and_auto_layout(builder):
    canvas = builder.canvas()
    canvas.select_nodes(["conv", "relu"])
    builder.copy()
    check_undo_redo(builder, builder.paste, "Paste")
    canvas.select_nodes(["conv"])
    check_undo_redo(builder, builder.duplicate, "Duplicate")
    # Scatter the cards, then lay them out again: one step that puts everything back in layers.
    s = builder.sketch()
    for i, nid in enumerate(["img", "conv", "relu", "out"]):
        s.move_node(nid, 500 - 120 * i, 37 * i)
    builder.set_sketch(s.copy())
    after = check_undo_redo(builder, builder.auto_layout, "Auto layout")
    ys = {n["id"]: n["y"] for n in after["nodes"]}
    assert ys["img"] < ys["conv"] < ys["relu"] < ys["out"]


def test_refused_edit_leaves_no_step(builder):
    from gui.builder import commands as C

    doc = builder.document()
    msgs = []
    builder.message.connect(msgs.append)
    assert not doc.push(C.ConnectCommand(doc, "relu", "conv"))  # a cycle
    assert builder.undo_stack().count() == 0 and msgs and "cycle" in msgs[0]
    assert {(e.src, e.dst) for e in builder.sketch().edges} == {("img", "conv"), ("conv", "relu"), ("relu", "out")}


def test_dirty_mark_follows_the_undo_stack(builder, tmp_path):
    doc = builder.document()
    assert not doc.is_dirty()
    marks = []
    doc.dirtyChanged.connect(marks.append)
    builder.select_node("conv")
    builder.inspector().commit("out_channels", "8")
    assert doc.is_dirty()
    builder.undo_stack().undo()
    assert not doc.is_dirty()
    builder.undo_stack().redo()
    doc.save_as(tmp_path / "net.json")
    assert not doc.is_dirty() and marks == [True, False, True, False]
