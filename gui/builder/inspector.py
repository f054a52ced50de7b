"""The inspector: edits the selected node's fields with one widget per catalogue FieldSpec. A value the
catalogue refuses stays at the field with the reason under it and never reaches the sketch.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QLabel,
    QLineEdit,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from engine.core.errors import UserError
from engine.core.units import format_count
from engine.sketch.catalogue import CATALOGUE, validate_field
from engine.sketch.document import Node
from engine.sketch.layer_types import FieldSpec

from . import commands as C
from .document import SketchDocument
from .node_item import NodeResult, format_shape

ERROR_STYLE = "QLineEdit { border: 1.5px solid #d32f2f; border-radius: 3px; padding: 1px 3px; }"


def field_text(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class Inspector(QWidget):
    """Shows one node (`show_node`); every accepted edit is a SetFieldCommand on the document."""

    def __init__(self, document: SketchDocument, parent: QWidget | None = None):
        super().__init__(parent)
        self._doc = document
        self._node_id = ""
        self._type = ""
        self._editors: dict[str, QWidget] = {}
        self._errors: dict[str, QLabel] = {}
        self._shape_result: NodeResult | None = None

        self.title = QLabel(self)
        f = self.title.font()
        f.setBold(True)
        f.setPointSizeF(f.pointSizeF() + 2)
        self.title.setFont(f)
        self.subtitle = QLabel(self)
        self.subtitle.setStyleSheet("color: palette(mid);")
        self.description = QLabel(self)
        self.description.setWordWrap(True)
        self.info = QLabel(self)
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        self.form_host = QWidget(self)
        self.form = QFormLayout(self.form_host)
        self.form.setContentsMargins(0, 4, 0, 4)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.empty = QLabel("Select a layer to edit its fields.\n\nDrag layers from the palette onto the canvas; "
                            "drop one on a connection to insert it there.", self)
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop)

        inner = QWidget()
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(8, 8, 8, 8)
        for w in (self.title, self.subtitle, self.description):
            lay.addWidget(w)
        line = QFrame()
        line.setFrameShape(QFrame.Shape.HLine)
        line.setFrameShadow(QFrame.Shadow.Sunken)
        lay.addWidget(line)
        lay.addWidget(self.form_host)
        lay.addWidget(self.info)
        lay.addWidget(self.empty)
        lay.addStretch(1)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.setMinimumWidth(220)
        self._show_empty()

    # ---- public --------------------------------------------------------------------------------------
    def node_id(self) -> str:
        return self._node_id

    def editor(self, field_name: str) -> QWidget | None:
        return self._editors.get(field_name)

    def error_text(self, field_name: str) -> str:
        lab = self._errors.get(field_name)
        return lab.text() if lab is not None and not lab.isHidden() else ""

    def show_node(self, node_id: str) -> None:
        nodes = C.sketch_nodes(self._doc.sketch)
        if not node_id or node_id not in nodes:
            self._node_id, self._type = "", ""
            self._show_empty()
            return
        node = nodes[node_id]
        if node_id != self._node_id or node.type != self._type:
            self._node_id, self._type = node_id, node.type
            self._build(node)
        self.refresh()

    def set_shape_result(self, result: NodeResult | None) -> None:
        """The shown node's {"shape", "params", "error", "memory"} (the builder widget's merge of the engine's
        ShapeResult and the analytic figures)."""
        self._shape_result = result
        self._update_info()

    def refresh(self) -> None:
        """Re-read the shown node's values from the sketch (after an edit, undo or redo)."""
        nodes = C.sketch_nodes(self._doc.sketch)
        if self._node_id not in nodes:
            self.show_node("")
            return
        node = nodes[self._node_id]
        ro = self._doc.read_only
        for name, w in self._editors.items():
            v = node.fields.get(name)
            w.blockSignals(True)
            if isinstance(w, QCheckBox):
                w.setChecked(bool(v))
            elif isinstance(w, QComboBox):
                w.setCurrentText(str(v))
            elif isinstance(w, QLineEdit):  # the third and last kind of editor _make_editor makes
                w.setText(field_text(v))
            w.blockSignals(False)
            w.setEnabled(not ro)
            self._set_error(name, "")
        self._update_info()

    # ---- building ------------------------------------------------------------------------------------
    def _show_empty(self) -> None:
        self._clear_form()
        for w in (self.title, self.subtitle, self.description, self.info, self.form_host):
            w.hide()
        self.empty.show()

    def _clear_form(self) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self._editors.clear()
        self._errors.clear()

    def _build(self, node: Node) -> None:
        self._clear_form()
        lt = CATALOGUE.get(node.type)
        self.title.setText(node.type)
        self.subtitle.setText(node.id)
        self.description.setText(lt.description if lt else "")
        for w in (self.title, self.subtitle, self.description, self.info, self.form_host):
            w.show()
        self.empty.hide()
        if lt is None:
            return
        for spec in lt.fields:
            editor = self._make_editor(spec)
            editor.setToolTip(spec.help or "")
            err = QLabel(self.form_host)
            err.setWordWrap(True)
            err.setStyleSheet("color: #d32f2f;")
            err.hide()
            box = QWidget(self.form_host)
            v = QVBoxLayout(box)
            v.setContentsMargins(0, 0, 0, 0)
            v.setSpacing(1)
            v.addWidget(editor)
            if spec.help:
                hint = QLabel(spec.help, self.form_host)
                hint.setWordWrap(True)
                hf = hint.font()
                hf.setPointSizeF(hf.pointSizeF() - 1)
                hint.setFont(hf)
                hint.setStyleSheet("color: palette(mid);")
                v.addWidget(hint)
            v.addWidget(err)
            label = QLabel(spec.name.replace("_", " "), self.form_host)
            label.setToolTip(spec.help or "")
            self.form.addRow(label, box)
            self._editors[spec.name] = editor
            self._errors[spec.name] = err

    def _make_editor(self, spec: FieldSpec) -> QWidget:
        name = spec.name
        if spec.kind == "bool":
            check = QCheckBox(self.form_host)
            check.toggled.connect(lambda on, n=name: self.commit(n, on))
            return check
        if spec.kind == "choice":
            combo = QComboBox(self.form_host)
            combo.addItems([str(c) for c in spec.choices])
            combo.activated.connect(lambda _i, n=name, box=combo: self.commit(n, box.currentText()))
            return combo
        w = QLineEdit(self.form_host)
        if spec.kind == "ints":
            w.setPlaceholderText("e.g. 3 or 3, 3")
        elif spec.help and "0 =" in spec.help:
            w.setPlaceholderText(spec.help)
        w.editingFinished.connect(lambda n=name, e=w: self.commit(n, e.text()))
        return w

    # ---- editing -------------------------------------------------------------------------------------
    def commit(self, field_name: str, raw: object) -> bool:
        """Validate `raw` with the catalogue and set it; on refusal show the reason at the field."""
        nodes = C.sketch_nodes(self._doc.sketch)
        node = nodes.get(self._node_id)
        if node is None or field_name not in self._editors:
            return False
        try:
            value = validate_field(node.type, field_name, raw)
        except UserError as err:
            self._set_error(field_name, str(err))
            return False
        self._set_error(field_name, "")
        if _same(node.fields.get(field_name), value):
            self.refresh_field(field_name)
            return True
        ok = self._doc.push(C.SetFieldCommand(self._doc, self._node_id, field_name, value))
        if not ok:
            self._set_error(field_name, "refused by the sketch")
        return ok

    def refresh_field(self, name: str) -> None:
        node = C.sketch_nodes(self._doc.sketch).get(self._node_id)
        w = self._editors.get(name)
        if node is None or w is None or not isinstance(w, QLineEdit):
            return
        w.blockSignals(True)
        w.setText(field_text(node.fields.get(name)))
        w.blockSignals(False)

    def _set_error(self, name: str, text: str) -> None:
        lab, w = self._errors.get(name), self._editors.get(name)
        if lab is None:
            return
        lab.setText(text)
        lab.setVisible(bool(text))
        if isinstance(w, QLineEdit):
            w.setStyleSheet(ERROR_STYLE if text else "")
            w.setToolTip(text or "")

    def _update_info(self) -> None:
        r = self._shape_result
        if not self._node_id or r is None:
            self.info.setText("")
            return
        err = r.get("error")
        parts = []
        if err:
            parts.append(f"<span style='color:#d32f2f'><b>Shapes do not fit:</b> {_html(err)}</span>")
        else:
            parts.append(f"Output <tt>{format_shape(r.get('shape'))}</tt>")
        parts.append(f"Parameters {format_count(None if err else r.get('params'))}")
        mem = r.get("memory")
        if mem is not None:
            from engine.core.units import format_bytes

            parts.append(f"Memory {format_bytes(mem)}")
        self.info.setText("<br>".join(parts))


def _same(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    return a == b and type(a) is type(b)


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
