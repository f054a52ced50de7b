"""Monitor ▸ Add Prometheus server…: the server's URL and how to sign in (none, bearer token, user and password,
or the VRAMSCOPE_PROMETHEUS_* environment variables). The URL, the kind of sign-in and the user name are
remembered in the app's settings; a token or password never is: it lives in memory for this session only."""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from engine.core.errors import UserError
from engine.monitor.promapi import ENV_PASSWORD, ENV_TOKEN, ENV_USER, Credentials, PromClient, check_url

AUTH_NONE, AUTH_TOKEN, AUTH_BASIC, AUTH_ENV = "none", "token", "basic", "env"
_AUTH_LABELS = ((AUTH_NONE, "None"), (AUTH_TOKEN, "Bearer token"), (AUTH_BASIC, "User and password"),
                (AUTH_ENV, "From the environment"))
KEY_URL, KEY_AUTH, KEY_USER, KEY_TIMEOUT = ("monitor/prometheus_url", "monitor/prometheus_auth",
                                            "monitor/prometheus_user", "monitor/prometheus_timeout")


class PrometheusDialog(QDialog):
    def __init__(self, settings: QSettings | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add Prometheus server")
        self.settings = settings
        lay = QVBoxLayout(self)
        intro = QLabel("Show every GPU a Prometheus server scrapes from NVIDIA's dcgm-exporter or nvitop-exporter "
                       "(or from “vramscope monitor --serve-metrics” on another machine).")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://prometheus:9090")
        self.auth_combo = QComboBox()
        for key, label in _AUTH_LABELS:
            self.auth_combo.addItem(label, key)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.user_edit = QLineEdit()
        self.password_edit = QLineEdit()
        self.password_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.env_note = QLabel(f"${ENV_TOKEN}, or ${ENV_USER} and ${ENV_PASSWORD}")
        self.env_note.setObjectName("Dim")
        form.addRow("Server URL", self.url_edit)
        form.addRow("Sign in", self.auth_combo)
        form.addRow("Token", self.token_edit)
        form.addRow("User", self.user_edit)
        form.addRow("Password", self.password_edit)
        form.addRow("", self.env_note)
        self._form = form
        lay.addLayout(form)
        note = QLabel("Tokens and passwords are kept for this session only, never saved.")
        note.setObjectName("Dim")
        lay.addWidget(note)
        self.error_label = QLabel()
        self.error_label.setStyleSheet("color: #d43c3c")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        lay.addWidget(self.error_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Add")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.auth_combo.currentIndexChanged.connect(self._auth_changed)
        if settings is not None:
            self.url_edit.setText(str(settings.value(KEY_URL, "") or ""))
            k = self.auth_combo.findData(str(settings.value(KEY_AUTH, AUTH_NONE) or AUTH_NONE))
            self.auth_combo.setCurrentIndex(max(0, k))
            self.user_edit.setText(str(settings.value(KEY_USER, "") or ""))
        self._auth_changed()
        self.client: PromClient | None = None

    def _auth_changed(self) -> None:
        kind = self.auth_combo.currentData()
        for w, show in ((self.token_edit, kind == AUTH_TOKEN), (self.user_edit, kind == AUTH_BASIC),
                        (self.password_edit, kind == AUTH_BASIC), (self.env_note, kind == AUTH_ENV)):
            self._form.setRowVisible(w, show)

    def credentials(self) -> Credentials:
        kind = self.auth_combo.currentData()
        if kind == AUTH_TOKEN:
            return Credentials(token=self.token_edit.text().strip() or None)
        if kind == AUTH_BASIC:
            return Credentials(user=self.user_edit.text().strip() or None, password=self.password_edit.text())
        if kind == AUTH_ENV:
            return Credentials.from_env()
        return Credentials()

    def accept(self) -> None:
        try:
            url, from_url = check_url(self.url_edit.text())
        except UserError as e:
            self.error_label.setText(str(e))
            self.error_label.show()
            self.url_edit.setFocus()
            return
        creds = self.credentials()
        if self.auth_combo.currentData() == AUTH_TOKEN and not creds.token:
            self.error_label.setText("Token: empty; paste the bearer token, or pick another way to sign in")
            self.error_label.show()
            return
        self.client = PromClient(url, from_url if from_url is not None and creds == Credentials() else creds)
        if self.settings is not None:
            self.settings.setValue(KEY_URL, url)  # without any user:password@ the URL held
            self.settings.setValue(KEY_AUTH, self.auth_combo.currentData())
            self.settings.setValue(KEY_USER, self.user_edit.text().strip())
        super().accept()
