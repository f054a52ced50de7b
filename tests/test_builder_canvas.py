"""The builder canvas on the offscreen platform: palette drops (through the same events a mouse sends), insert on
a connection, append below the last layer, wiring ports by dragging, Delete, copy/paste/duplicate, the red error
state and memory on the cards. Shapes and parameter counts are checked against torch itself."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

import torch  # noqa: E402
from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QMouseEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from torch import nn  # noqa: E402

from engine.sketch.document import Sketch  # noqa: E402

# Qt marks the QPoint drag-event constructors deprecated; they are still what a drag delivers.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.fixture
def builder(qtbot, tmp_path):
    from gui.builder import BuilderWidget

    w = BuilderWidget(autosave_dir=tmp_path / "autosave", autosave_interval_s=0)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    qtbot.waitExposed(w)
    return w


def mlp_sketch() -> Sketch:
    """Input(784) -> Linear(10) -> Output, spaced for the cards."""
    s = Sketch("mlp")
    s.add_node("Input", {"shape": (784,)}, 0, 0, id="inp")
    s.add_node("Linear", {"out_features": 10}, 0, 200, id="fc")
    s.add_node("Output", None, 0, 400, id="out")
    s.connect("inp", "fc")
    s.connect("fc", "out")
    return s


def drop(canvas, mime, scene_pos: QPointF) -> QDropEvent:
    """Drag enter, move and drop at `scene_pos`, as a mouse drag from the palette delivers them."""
    vp = canvas.viewport()
    p = canvas.mapFromScene(scene_pos)
    acts = Qt.DropAction.CopyAction
    btn, mod = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(p, acts, mime, btn, mod)
    QApplication.sendEvent(vp, enter)
    assert enter.isAccepted()
    move = QDragMoveEvent(p, acts, mime, btn, mod)
    QApplication.sendEvent(vp, move)
    ev = QDropEvent(QPointF(p), acts, mime, btn, mod)
    QApplication.sendEvent(vp, ev)
    return ev


def edges(sketch) -> set[tuple[str, str]]:
    return {(e.src, e.dst) for e in sketch.edges}


def test_dragging_a_palette_item_onto_the_canvas_creates_a_node(builder, qtbot):
    canvas = builder.canvas()
    mime = builder.palette().mime_for("Conv2d")
    with qtbot.waitSignal(builder.sketchChanged, timeout=2000) as changed:
        ev = drop(canvas, mime, QPointF(300, 200))
    assert ev.isAccepted()
    sk = changed.args[0]
    assert [n.type for n in sk.nodes.values()] == ["Conv2d"]
    nid = next(iter(sk.nodes))
    # Dropped where the mouse was: the card is centred on the drop point.
    item = canvas.scene_().nodes[nid]
    assert item.sceneBoundingRect().contains(QPointF(300, 200))
    assert builder.selected_node() == nid  # the new layer is ready for the inspector


def test_palette_filter_finds_layers_by_name_and_group(builder):
    pal = builder.palette()
    pal.set_filter("norm")
    shown = pal.type_names(visible_only=True)
    assert {"BatchNorm2d", "LayerNorm", "GroupNorm", "RMSNorm"} <= set(shown)
    assert "Linear" not in shown
    pal.set_filter("")
    assert "Linear" in pal.type_names(visible_only=True)


def test_dropping_on_a_connection_inserts_the_layer_there(builder, qtbot):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    edge = canvas.scene_().edges[("inp", "fc", 0)]
    mid = edge.path().pointAtPercent(0.5)
    drop(canvas, builder.palette().mime_for("ReLU"), mid)
    sk = builder.sketch()
    relu = next(n.id for n in sk.nodes.values() if n.type == "ReLU")
    assert edges(sk) == {("inp", relu), (relu, "fc"), ("fc", "out")}
    # ReLU keeps the shape; Linear still maps 784 -> 10 with torch's parameter count.
    shapes = builder.shapes()
    assert shapes[relu].shape == (784,)
    assert shapes["fc"].params == _numel(nn.Linear(784, 10))
    # Room was made: no two cards overlap.
    items = list(canvas.scene_().nodes.values())
    for a in items:
        for b in items:
            if a is not b:
                assert not a.sceneBoundingRect().adjusted(4, 4, -4, -4).intersects(
                    b.sceneBoundingRect().adjusted(4, 4, -4, -4))


def test_dropping_below_the_last_layer_appends_and_connects(builder):
    s = Sketch()
    s.add_node("Input", {"shape": (3, 32, 32)}, 0, 0, id="img")
    builder.set_sketch(s)
    canvas = builder.canvas()
    below = canvas.scene_().nodes["img"].sceneBoundingRect().bottomLeft() + QPointF(100, 120)
    drop(canvas, builder.palette().mime_for("Conv2d"), below)
    sk = builder.sketch()
    conv = next(n.id for n in sk.nodes.values() if n.type == "Conv2d")
    assert edges(sk) == {("img", conv)}
    # nn.Conv2d(3, 64, 3) on 32x32 gives 64x30x30.
    assert builder.shapes()[conv].shape == tuple(nn.Conv2d(3, 64, 3)(torch.zeros(1, 3, 32, 32)).shape[1:])
    # Appending below an Output puts the layer before it.
    builder.set_sketch(mlp_sketch())
    out = canvas.scene_().nodes["out"].sceneBoundingRect()
    drop(canvas, builder.palette().mime_for("Dropout"), out.bottomLeft() + QPointF(100, 100))
    sk = builder.sketch()
    d = next(n.id for n in sk.nodes.values() if n.type == "Dropout")
    assert edges(sk) == {("inp", "fc"), ("fc", d), (d, "out")}


def _mouse(vp, kind, pos: QPoint, buttons):
    ev = QMouseEvent(kind, QPointF(pos), QPointF(vp.mapToGlobal(pos)), Qt.MouseButton.LeftButton
                     if kind != QMouseEvent.Type.MouseMove else Qt.MouseButton.NoButton, buttons,
                     Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(vp, ev)


def mouse_drag(canvas, a: QPointF, b: QPointF) -> None:
    vp = canvas.viewport()
    pa, pb = canvas.mapFromScene(a), canvas.mapFromScene(b)
    left = Qt.MouseButton.LeftButton
    _mouse(vp, QMouseEvent.Type.MouseButtonPress, pa, left)
    for t in (0.25, 0.5, 0.75, 1.0):
        _mouse(vp, QMouseEvent.Type.MouseMove, pa + (pb - pa) * t, left)
    _mouse(vp, QMouseEvent.Type.MouseButtonRelease, pb, Qt.MouseButton.NoButton)


def test_ports_connect_and_disconnect_by_dragging(builder):
    s = Sketch()
    s.add_node("Input", {"shape": (784,)}, 0, 0, id="inp")
    s.add_node("Linear", {"out_features": 32}, 0, 220, id="fc")
    builder.set_sketch(s)
    canvas = builder.canvas()
    sc = canvas.scene_()
    src_port = sc.nodes["inp"].out_port.scenePos()
    dst_port = sc.nodes["fc"].in_port.scenePos()
    mouse_drag(canvas, src_port, dst_port)
    assert edges(builder.sketch()) == {("inp", "fc")}
    assert builder.shapes()["fc"].shape == (32,)
    # Pick the connection up at its input end and drop it on empty canvas: disconnected.
    mouse_drag(canvas, dst_port, dst_port + QPointF(400, 150))
    assert edges(builder.sketch()) == set()
    # A connection that would make a cycle is refused with the engine's reason, nothing changes.
    mouse_drag(canvas, src_port, dst_port)
    messages = []
    canvas.message.connect(messages.append)
    mouse_drag(canvas, sc.nodes["fc"].out_port.scenePos(), sc.nodes["inp"].sceneBoundingRect().center())
    assert edges(builder.sketch()) == {("inp", "fc")}
    assert messages and "cycle" in messages[0]


def test_moving_a_card_is_one_undoable_step(builder):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    card = canvas.scene_().nodes["fc"]
    header = card.sceneBoundingRect().topLeft() + QPointF(40, 14)  # the title, away from the port
    mouse_drag(canvas, header, header + QPointF(160, 40))
    n = builder.sketch().nodes["fc"]
    assert (n.x, n.y) == pytest.approx((160, 240), abs=2)
    st = builder.undo_stack()
    assert st.count() == 1 and st.text(0) == "Move layer"
    st.undo()
    assert (builder.sketch().nodes["fc"].x, builder.sketch().nodes["fc"].y) == (0, 200)


def test_keyboard_delete_removes_the_selection(builder, qtbot):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    builder.select_node("fc")
    canvas.setFocus()
    qtbot.keyClick(canvas, Qt.Key.Key_Delete)
    sk = builder.sketch()
    assert set(sk.nodes) == {"inp", "out"} and edges(sk) == set()
    builder.undo_stack().undo()
    assert edges(builder.sketch()) == {("inp", "fc"), ("fc", "out")}
    # A selected connection alone: Delete disconnects it and keeps both layers.
    canvas.scene_().clearSelection()
    canvas.scene_().edges[("fc", "out", 0)].setSelected(True)
    qtbot.keyClick(canvas, Qt.Key.Key_Delete)
    assert set(builder.sketch().nodes) == {"inp", "fc", "out"}
    assert edges(builder.sketch()) == {("inp", "fc")}


def test_copy_paste_and_duplicate(builder):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    canvas.select_nodes(["inp", "fc"])
    assert builder.copy()
    new = builder.paste()
    sk = builder.sketch()
    assert len(new) == 2 and len(sk.nodes) == 5
    types = sorted(sk.nodes[n].type for n in new)
    assert types == ["Input", "Linear"]
    # The connection between the copied layers comes along; nothing links the copy to the original.
    new_in = next(n for n in new if sk.nodes[n].type == "Input")
    new_fc = next(n for n in new if sk.nodes[n].type == "Linear")
    assert (new_in, new_fc) in edges(sk) and len(sk.edges) == 3
    assert sk.nodes[new_fc].fields["out_features"] == 10
    assert builder.shapes()[new_fc].params == _numel(nn.Linear(784, 10))
    assert sorted(canvas.selected_node_ids()) == sorted(new)  # the pasted copy is selected
    # Duplicate the selected Linear alone: one new, unconnected card.
    canvas.select_nodes([new_fc])
    dup = builder.duplicate()
    sk = builder.sketch()
    assert len(dup) == 1 and sk.nodes[dup[0]].type == "Linear" and len(sk.nodes) == 6
    assert not [e for e in sk.edges if dup[0] in (e.src, e.dst)]
    st = builder.undo_stack()
    assert [st.text(i) for i in range(st.count())] == ["Paste", "Duplicate"]


def test_a_shape_error_marks_the_node_red_with_its_reason_and_the_rest_keeps_estimating(builder):
    s = Sketch()
    s.add_node("Input", {"shape": (784,)}, 0, 0, id="inp")
    s.add_node("Linear", {"in_features": 100, "out_features": 10}, 0, 200, id="bad")
    s.add_node("Linear", {"out_features": 5}, 0, 400, id="after")
    s.add_node("Linear", {"out_features": 64}, 300, 200, id="good")
    for a, b in (("inp", "bad"), ("bad", "after"), ("inp", "good")):
        s.connect(a, b)
    # What torch itself says about the same layer.
    with pytest.raises(RuntimeError):
        nn.Linear(100, 10)(torch.zeros(1, 784))
    builder.set_sketch(s)
    sc = builder.canvas().scene_()
    bad, after, good = sc.nodes["bad"], sc.nodes["after"], sc.nodes["good"]
    assert bad.failed() and "100" in bad.error and "784" in bad.error
    assert bad.toolTip().count("784") == 1
    assert after.blocked() and not after.failed()  # waits for "bad", not red itself
    assert not good.error and good.shape_ == (64,) and good.params == _numel(nn.Linear(784, 64))
    # Red on screen: the header band of the failing card is drawn in the error colour.
    img = builder.canvas().viewport().grab().toImage()
    view_pt = builder.canvas().mapFromScene(bad.sceneBoundingRect().topLeft() + QPointF(40, 8))
    c = img.pixelColor(view_pt)
    assert c.red() > 180 and c.green() < 90 and c.blue() < 90
    # Fixing the field clears it.
    builder.select_node("bad")
    builder.inspector().commit("in_features", "0")
    assert not sc.nodes["bad"].error and sc.nodes["after"].shape_ == (5,)


def test_node_results_show_memory_on_the_cards(builder):
    builder.set_sketch(mlp_sketch())
    fc = builder.canvas().scene_().nodes["fc"]
    assert fc.memory is None
    builder.set_node_results({"fc": {"memory": 3 * 1024 * 1024, "shape": (10,), "error": None, "params": 7850},
                              "gone": {"memory": 1}})
    assert fc.memory == 3 * 1024 * 1024 and not fc.memory_stale
    # After an edit the old figure stays, dimmed, until the next results arrive.
    builder.select_node("fc")
    builder.inspector().commit("out_features", "20")
    assert fc.memory == 3 * 1024 * 1024 and fc.memory_stale


def test_zoom_pan_and_fit(builder):
    from engine.sketch.document import load_template

    builder.set_sketch(load_template("resnet18"))
    canvas = builder.canvas()
    builder.zoom_to_fit()
    vis = canvas.mapToScene(canvas.viewport().rect()).boundingRect()
    assert vis.contains(canvas.scene_().itemsBoundingRect().adjusted(10, 10, -10, -10))
    z = canvas.zoom()
    canvas.zoom_by(2.0)
    assert canvas.zoom() == pytest.approx(2 * z)
    # Middle-drag pans the view.
    before = canvas.mapToScene(canvas.viewport().rect().center())
    vp = canvas.viewport()
    mid = Qt.MouseButton.MiddleButton
    p = QPoint(400, 400)
    QApplication.sendEvent(vp, QMouseEvent(QMouseEvent.Type.MouseButtonPress, QPointF(p), QPointF(p), mid, mid,
                                           Qt.KeyboardModifier.NoModifier))
    q = QPoint(300, 250)
    QApplication.sendEvent(vp, QMouseEvent(QMouseEvent.Type.MouseMove, QPointF(q), QPointF(q),
                                           Qt.MouseButton.NoButton, mid, Qt.KeyboardModifier.NoModifier))
    QApplication.sendEvent(vp, QMouseEvent(QMouseEvent.Type.MouseButtonRelease, QPointF(q), QPointF(q), mid,
                                           Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier))
    after = canvas.mapToScene(canvas.viewport().rect().center())
    assert after != before
    assert builder.undo_stack().count() == 0  # looking around is not an edit


def test_rubber_band_selects_several_cards(builder):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    sc = canvas.scene_()
    a = sc.nodes["inp"].sceneBoundingRect().topLeft() + QPointF(-60, -30)
    b = sc.nodes["fc"].sceneBoundingRect().bottomRight() + QPointF(60, 10)
    mouse_drag(canvas, a, b)
    assert sorted(canvas.selected_node_ids()) == ["fc", "inp"]
    assert builder.selected_node() == ""  # several selected: the inspector shows none
    assert builder.undo_stack().count() == 0


def test_double_click_in_the_palette_appends_and_wheel_zooms(builder, qtbot):
    from PySide6.QtGui import QWheelEvent

    builder.set_sketch(mlp_sketch())
    pal = builder.palette()
    item = pal.item_for("Dropout")
    pal.tree.itemActivated.emit(item, 0)
    sk = builder.sketch()
    d = next(n.id for n in sk.nodes.values() if n.type == "Dropout")
    assert edges(sk) == {("inp", "fc"), ("fc", d), (d, "out")}  # appended before the Output
    # An Output cannot sit on a connection: dropped on one, it is added alone.
    canvas = builder.canvas()
    mid = canvas.scene_().edges[("inp", "fc", 0)].path().pointAtPercent(0.5)
    new = canvas.handle_drop("Output", mid)
    assert new and not [e for e in builder.sketch().edges if new in (e.src, e.dst)]
    # The wheel zooms around the mouse.
    z = canvas.zoom()
    vp = canvas.viewport()
    c = QPointF(vp.rect().center())
    ev = QWheelEvent(c, QPointF(vp.mapToGlobal(c.toPoint())), QPoint(0, 0), QPoint(0, 240),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.ControlModifier, Qt.ScrollPhase.NoScrollPhase,
                     False)
    QApplication.sendEvent(vp, ev)
    assert canvas.zoom() == pytest.approx(z * 1.0015 ** 240, rel=1e-3)


def test_space_drag_pans_without_editing(builder, qtbot):
    builder.set_sketch(mlp_sketch())
    canvas = builder.canvas()
    canvas.zoom_by(2.0)
    canvas.setFocus()
    qtbot.keyPress(canvas, Qt.Key.Key_Space)
    before = canvas.mapToScene(canvas.viewport().rect().center())
    card = canvas.scene_().nodes["fc"].sceneBoundingRect()
    start = card.topLeft() + QPointF(30, 14)  # even on a card, space+drag pans instead of moving it
    mouse_drag(canvas, start, start + QPointF(-80, -60))
    qtbot.keyRelease(canvas, Qt.Key.Key_Space)
    after = canvas.mapToScene(canvas.viewport().rect().center())
    assert (after - before).manhattanLength() > 20
    assert builder.sketch().nodes["fc"].x == 0 and builder.undo_stack().count() == 0
