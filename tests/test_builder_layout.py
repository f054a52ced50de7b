"""The builder's automatic layout (pure Python): layers go down the page in dependency order, chains stay
straight, branches sit side by side, and no two cards overlap — on the real ResNet-18 and U-Net templates."""

from __future__ import annotations

from gui.builder.layout import H_GAP, NODE_H, NODE_W, V_GAP, layered_layout


def overlaps(pos: dict) -> list:
    items = list(pos.items())
    bad = []
    for i, (a, (ax, ay)) in enumerate(items):
        for b, (bx, by) in items[i + 1:]:
            if abs(ax - bx) < NODE_W and abs(ay - by) < NODE_H:
                bad.append((a, b))
    return bad


def test_chain_is_one_straight_column():
    ids = ["a", "b", "c", "d"]
    pos = layered_layout(ids, [("a", "b"), ("b", "c"), ("c", "d")])
    assert len({x for x, _ in pos.values()}) == 1
    ys = [pos[i][1] for i in ids]
    assert ys == sorted(ys) and ys[1] - ys[0] == NODE_H + V_GAP


def test_branches_sit_side_by_side_and_merge_below():
    # a -> (b, c) -> d: a residual-like diamond.
    pos = layered_layout(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert pos["b"][1] == pos["c"][1] > pos["a"][1]
    assert abs(pos["b"][0] - pos["c"][0]) == NODE_W + H_GAP
    assert pos["d"][1] > pos["b"][1]
    # The merge sits under the middle of its two inputs.
    assert pos["d"][0] == (pos["b"][0] + pos["c"][0]) / 2
    assert not overlaps(pos)


def test_real_templates_lay_out_in_dependency_order_without_overlaps():
    from engine.sketch.document import load_template

    for name in ("resnet18", "unet", "small-gpt"):
        sk = load_template(name)
        order = sk.topo_order()
        pos = layered_layout(order, [(e.src, e.dst) for e in sk.edges])
        assert set(pos) == set(sk.nodes)
        assert not overlaps(pos), name
        for e in sk.edges:
            assert pos[e.src][1] < pos[e.dst][1], (name, e)


def test_empty_and_taller_rows():
    assert layered_layout([], []) == {}
    pos = layered_layout(["a", "b"], [("a", "b")], heights={"a": 200.0})
    assert pos["b"][1] - pos["a"][1] == 200.0 + V_GAP


def test_templates_spaced_for_smaller_cards_are_tidied_once_opened():
    from engine.sketch.document import load_template
    from gui.builder.widget import tidy_positions

    sk = load_template("resnet18")
    assert tidy_positions(sk)  # the template's 90-unit rows are closer than a card is tall
    pos = {n.id: (n.x, n.y) for n in sk.nodes.values()}
    assert not overlaps(pos)
    assert not tidy_positions(sk)  # already tidy: left alone
