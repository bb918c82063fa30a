"""Render an SVG icon into a macOS .icns file (PNG-compressed entries), without `iconutil`.

    python packaging/make_icns.py [resources/icons/app.svg] [resources/app.icns]

Qt renders the SVG at every size macOS asks for; each size is stored as a PNG inside the icns
container (a 4-byte type and a big-endian length per entry, after an `icns` header). macOS 10.7+
reads PNG data for every type written here. Runs anywhere PySide6 runs (Linux included).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SVG = ROOT / "resources" / "icons" / "app.svg"
DEFAULT_ICNS = ROOT / "resources" / "app.icns"

# (icns type, pixel size): 1x and @2x renditions from 16 to 512 points.
ICNS_TYPES: tuple[tuple[bytes, int], ...] = (
    (b"icp4", 16),
    (b"icp5", 32),
    (b"ic11", 32),  # 16@2x
    (b"ic12", 64),  # 32@2x
    (b"ic07", 128),
    (b"ic13", 256),  # 128@2x
    (b"ic08", 256),
    (b"ic14", 512),  # 256@2x
    (b"ic09", 512),
    (b"ic10", 1024),  # 512@2x
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# macOS (11+) app icons leave a transparent margin: an 824-pixel shape on a 1024 canvas.
MARGIN = 100 / 1024


def render_png(svg: Path, size: int, margin: float = MARGIN) -> bytes:
    """PNG bytes of `svg` rendered at `size` x `size` pixels on a transparent background,
    inset by `margin` (a fraction of `size`) on every side."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QRectF, Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG file")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    inset = size * margin
    renderer.render(painter, QRectF(inset, inset, size - 2 * inset, size - 2 * inset))
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):
        raise RuntimeError("Qt could not encode a PNG")
    buffer.close()
    return bytes(data.data())


def build_icns(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An icns container holding `(type, data)` entries, in order."""
    body = b"".join(kind + struct.pack(">I", len(data) + 8) + data for kind, data in entries)
    return b"icns" + struct.pack(">I", len(body) + 8) + body


def read_icns(blob: bytes) -> list[tuple[bytes, bytes]]:
    """The `(type, data)` entries of an icns container; ValueError when it is malformed."""
    if blob[:4] != b"icns" or len(blob) < 8:
        raise ValueError("not an icns file (missing 'icns' header)")
    (total,) = struct.unpack(">I", blob[4:8])
    if total != len(blob):
        raise ValueError(f"icns header says {total} bytes, the file has {len(blob)}")
    entries, pos = [], 8
    while pos < total:
        kind, (length,) = blob[pos : pos + 4], struct.unpack(">I", blob[pos + 4 : pos + 8])
        if length < 8 or pos + length > total:
            raise ValueError(f"icns entry {kind!r} at byte {pos} has a bad length {length}")
        entries.append((kind, blob[pos + 8 : pos + length]))
        pos += length
    return entries


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if data[:8] != PNG_MAGIC:
        raise ValueError("not PNG data")
    return struct.unpack(">II", data[16:24])


def make_icns(svg: Path = DEFAULT_SVG, out: Path = DEFAULT_ICNS) -> Path:
    """Render `svg` at every icns size and write `out`. Returns `out`."""
    from PySide6.QtGui import QGuiApplication

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _app = QGuiApplication.instance() or QGuiApplication(["make_icns"])
    cache: dict[int, bytes] = {}
    entries = []
    for kind, size in ICNS_TYPES:
        if size not in cache:
            cache[size] = render_png(svg, size)
        entries.append((kind, cache[size]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(build_icns(entries))
    return out


def main(argv: list[str]) -> int:
    svg = Path(argv[0]) if argv else DEFAULT_SVG
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_ICNS
    path = make_icns(svg, out)
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(ICNS_TYPES)} sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
