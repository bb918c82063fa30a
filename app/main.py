"""Entry point of `a2ats-chat` (placeholder window until the desktop app lands)."""

from __future__ import annotations

import sys

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)


def main(argv: list[str] | None = None) -> int:
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication(sys.argv if argv is None else ["a2ats-chat", *argv])
    label = QLabel("A2ATS Chat")
    label.resize(480, 320)
    label.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
