"""Ask for a Hugging Face repo id ("org/name") to download and load."""

from __future__ import annotations

import re

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def valid_repo_id(text: str) -> bool:
    return bool(REPO_ID.match(text.strip()))


class HuggingFaceDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download from Hugging Face")
        self.setMinimumWidth(460)
        text = QLabel(
            "Enter a model repository id, for example <code>mlx-community/SmolLM2-135M-Instruct</code>. "
            "The model is downloaded (this needs an internet connection) and loaded."
        )
        text.setWordWrap(True)
        self.repo = QLineEdit()
        self.repo.setPlaceholderText("organization/model-name")
        self.repo.setAccessibleName("Repository id")
        self.error = QLabel()
        self.error.setObjectName("ErrorLabel")
        self.error.hide()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Download")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addWidget(self.repo)
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)

    def repo_id(self) -> str:
        return self.repo.text().strip()

    def accept(self) -> None:
        if not valid_repo_id(self.repo_id()):
            self.error.setText("A repository id looks like organization/model-name.")
            self.error.show()
            return
        super().accept()
