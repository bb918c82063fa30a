"""The main window's status bar: model, the layer plan ("A2ATS on 5 of 26 layers"), how the
last step attended ("exact until 2,048 tokens" / "A2ATS retrieving"), context used/limit, TTFT,
tokens/s, peak memory, cache."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from a2ats_engine.cache.layer_plan import LayerPlan

from .elided_label import ElidedLabel
from .inert_text import rich_from_plain
from .units import human_bytes


def plan_text(plan: LayerPlan | None, a2ats_enabled: bool) -> str:
    """What the cache does on the model's layers, plainly: "A2ATS on all 30 layers", "A2ATS on
    5 of 26 layers", "A2ATS off"; "" when the plan is unknown (nothing is claimed then)."""
    if not a2ats_enabled:
        return "A2ATS off"
    if plan is None:
        return ""
    if plan.refused:
        return "A2ATS not supported"
    used = len(plan.a2ats_layers)
    if used == plan.num_layers and not plan.shared_layers:
        return f"A2ATS on all {used} layers"
    return plan.summary()


def plan_tooltip(plan: LayerPlan | None) -> str:
    """One line per kind of layer ("native  21  sliding window 512"), or ""."""
    return "\n".join(plan.describe()) if plan is not None else ""


class StatusBar(QStatusBar):
    """Model, context used/limit, TTFT, tokens/s, peak memory, cache bytes held; and the
    temporary message, in place of the first three while it is up. The texts elide (…) rather
    than widen the window, with the whole text in their tooltips."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.message = self._label("StatusMessage", "", "Status message")
        self.message.hide()
        self.addWidget(self.message, 1)
        self._message_timer = QTimer(self)
        self._message_timer.setSingleShot(True)
        self._message_timer.timeout.connect(self.clearMessage)
        self.model = self._label("StatusModel", "No model", "Model")
        self.plan = self._label("StatusPlan", "", "Layers using A2ATS")
        self.attention = self._label("StatusAttention", "", "How the last step attended")
        # Short numbers are never elided (a cut number says nothing); the texts above are.
        self.context = self._label("StatusContext", "", "Context used and limit", elide=False)
        self.ttft = self._label("StatusTTFT", "", "Time to first token", elide=False)
        self.speed = self._label("StatusSpeed", "", "Generation speed", elide=False)
        self.memory = self._label("StatusMemory", "", "Peak memory", elide=False)
        self.cache = self._label("StatusCache", "", "KV cache bytes held")
        labels = (
            self.model,
            self.plan,
            self.attention,
            self.context,
            self.ttft,
            self.speed,
            self.memory,
        )
        for label in (*labels, self.cache):
            self.addPermanentWidget(label)

    def _label(self, name: str, text: str, accessible: str, elide: bool = True) -> QLabel:
        label = ElidedLabel(text) if elide else QLabel(text)
        label.setTextFormat(Qt.TextFormat.PlainText)  # the model's name is untrusted
        label.setObjectName(name)
        label.setAccessibleName(accessible)
        return label

    # ---- the temporary message (QStatusBar's own would be cut off by the labels) ----------
    def showMessage(self, text: str, timeout: int = 0) -> None:  # noqa: N802 (Qt override)
        self.message.setText(text)
        self._show_message(bool(text))
        if timeout > 0:
            self._message_timer.start(timeout)
        else:
            self._message_timer.stop()
        self.messageChanged.emit(text)

    def clearMessage(self) -> None:  # noqa: N802 (Qt override)
        self._message_timer.stop()
        if self.message.text():
            self.message.setText("")
            self._show_message(False)
            self.messageChanged.emit("")

    def currentMessage(self) -> str:  # noqa: N802 (Qt override)
        return self.message.text()

    def _show_message(self, shown: bool) -> None:
        """A message takes the place of the model, plan and attention labels (the top bar and
        the inspector show those too) while it is up, as QStatusBar's own message would."""
        self.message.setVisible(shown)
        for label in (self.model, self.plan, self.attention):
            label.setVisible(not shown)

    def set_model(self, text: str) -> None:
        self.model.setText(text)

    def set_plan(self, plan: LayerPlan | None, a2ats_enabled: bool) -> None:
        self.plan.setText(plan_text(plan, a2ats_enabled))
        if not a2ats_enabled:
            self.attention.setText("")  # the next reply uses the model's own cache
        self.plan.setToolTip(rich_from_plain(plan_tooltip(plan)))  # names come from the model

    def set_attention(self, text: str) -> None:
        """How the last decode step attended (`app.inspector.data.attention_mode_text`):
        "exact until N tokens" below the exact crossover, "A2ATS retrieving" above it."""
        self.attention.setText(text)
        self.attention.setToolTip(
            "Below the crossover A2ATS attends exactly (faster there); above it, it retrieves."
            if text.startswith("exact until")
            else ""
        )

    def set_context(self, used: int, limit: int | None) -> None:
        limit_text = f"{limit:,}" if limit else "?"
        self.context.setText(f"ctx {used:,} / {limit_text}")

    def set_stats(self, ttft: float | None, tps: float | None, peak_gb: float | None) -> None:
        self.ttft.setText("" if ttft is None else f"TTFT {ttft:.2f} s")
        self.speed.setText("" if tps is None else f"{tps:.1f} tok/s")
        self.memory.setText("" if not peak_gb else f"peak {peak_gb:.2f} GB")

    def set_cache(
        self,
        held: int | None,
        fp16: int | None = None,
        a2ats: bool = True,
        codebook: int = 0,
        on_disk: int = 0,
    ) -> None:
        """`held`: the chat's cache bytes in memory; `codebook`: the model's codebook (one per
        model, shared by its chats), counted in memory; `on_disk`: K/V rows in the cold tier's
        files; `fp16`: what an fp16 cache would hold for the same tokens."""
        if not a2ats:
            self.attention.setText("")  # no A2ATS cache: nothing to say about how it attended
        if held is None:
            self.cache.setText("")
            return
        total = held + codebook
        text = f"cache {human_bytes(total)} in memory"
        if on_disk:
            text += f", {human_bytes(on_disk)} on disk"
        if fp16 and total:
            ratio = fp16 / total
            text += f" ({ratio:.1f}x less" if ratio >= 1 else f" ({1 / ratio:.1f}x more"
            text += f" than an fp16 cache's {human_bytes(fp16)})"
        self.cache.setText(text if a2ats else text + " KVCache")
        tip = "K/V cache bytes this chat holds in memory"
        if codebook:
            tip += f", with the model's codebook ({human_bytes(codebook)}, shared by all chats)"
        if on_disk:
            tip += "; K/V rows past the KV memory limit are in a file the OS can page out"
        self.cache.setToolTip(tip)
