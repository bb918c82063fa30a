"""Cache & sampling settings. Validated through the settings dataclasses (sampling: the engine's
own `SamplingSettings`); bad values show the dataclass's own message (field, value, range) and
keep the dialog open. The Sampling tab shows the loaded model's recommended sampling and uses it
unless the user turns "Use the model's recommended sampling" off and sets their own."""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from a2ats_engine.cache.config import preset_of, with_preset
from a2ats_engine.records import MODEL_SAMPLING_FIELDS, SamplingSettings

from ..settings import THEMES, CacheSettings

NEXT_MESSAGE_NOTE = (
    "Changes apply to the next message: the cache is rebuilt from the conversation then. "
    "The reply in progress, if any, is not affected."
)
KV_BITS = [
    ("Full precision (model dtype)", None),
    ("8-bit (mx.quantize)", 8),
    ("4-bit (mx.quantize)", 4),
]
KV_BITS_HELP = (
    "Full precision: fastest on a CPU, but the cache holds the most (float32 on a CPU: 2x an "
    "fp16 cache); ppl 1.024x full attention. 8-bit: 0.57x an fp16 cache, ppl 1.026x; decodes "
    "more slowly on a CPU (dequantization). 4-bit: 0.32x an fp16 cache, ppl 1.052x. Default: "
    "full precision on CPU-only MLX, 8-bit on Metal. Every choice also holds the codebook, once "
    "per model. (Demo model, 4K tokens: `a2ats eval --kv-bits`, `a2ats bench memory`.)"
)
KV_MEMORY_HELP = (
    "At most this much K/V in memory per chat (A2ATS layers). Past it the K/V rows go to a file "
    "in the cache folder that the OS can page out, and only the codes stay in memory: each "
    "decode step reads back the few rows it attends. Needs full-precision storage. "
    "\u201cno limit\u201d keeps every row in memory; 0 MB puts every row in the file."
)
PRESET_LABELS = {"speed": "Speed (default)", "quality": "Quality", None: "Custom"}
PRESET_HELP = (
    "Speed: rerank 2, the estimate only where it was measured to cost nothing on this machine: "
    "on every layer where it is cheap, else on the layers that miss most, as many as it can "
    "run on (the measurement made on a model's first load says so in the status bar). Quality: rerank "
    "4 (twice the candidates scored by their exact keys) and the missed-attention estimate below: at 8K on the demo model perplexity 0.999x "
    "full attention instead of 1.030x (three texts) and answers closer to full attention's, for "
    "a retrieval step that decodes at 0.95x KVCache's speed on a 2-core CPU instead of 1.14x "
    "(docs/BENCHMARKS.md). Choosing a preset sets the rerank and the estimate."
)
# The missed-attention estimate's choices: (label, A2ATSConfig.estimate_missed) by key.
ESTIMATE_CHOICES = {
    "auto": ("Where it costs nothing here (measured, per layer)", None),
    "on": ("On", True),
    "off": ("Off", False),
}
ESTIMATE_KEYS = {value: key for key, (_, value) in ESTIMATE_CHOICES.items()}
# The A2ATSConfig fields edited in a spin box of the same name, as they are.
CONFIG_SPINS = (
    "window", "far_offset", "sinks", "budget", "min_k", "far_buckets", "rerank", "fidelity_every",
)  # fmt: skip
FAR_OFFSET_TIP = "Far offset b (tokens): the one distance far tokens are scored at"
FAR_OFFSET_IGNORED_TIP = (
    "Not used with more than one distance bucket: far tokens are then scored at their "
    "bucket's own distance. Set Distance buckets to 1 to use b."
)


@dataclass(frozen=True)
class SettingsResult:
    """What the dialog saved. `sampling` holds the user's own values; while
    `use_model_sampling` is on the model's recommendation replaces them
    (`AppSettings.sampling_for`)."""

    cache: CacheSettings
    sampling: SamplingSettings
    theme: str
    default_system_prompt: str
    use_model_sampling: bool = True


def describe_sampling(sampling: SamplingSettings) -> str:
    """One line naming the model-recommended fields, e.g. "temperature 0 (greedy), top p 1"."""
    parts = []
    for name in MODEL_SAMPLING_FIELDS:
        value = getattr(sampling, name)
        label = name.replace("_", " ")
        parts.append(
            f"{label} {value:g}" + (" (greedy)" if name == "temperature" and not value else "")
        )
    return ", ".join(parts)


def _mib(limit: int | None) -> int:
    """A KV memory limit in bytes -> the spin box's MB (-1: no limit)."""
    return -1 if limit is None else min(limit // 2**20, 1 << 24)


def _spin(lo: int, hi: int, value: int, tip: str) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(lo, hi)
    spin.setValue(value)
    spin.setToolTip(tip)
    spin.setAccessibleName(tip)
    return spin


def _dspin(lo: float, hi: float, value: float, step: float, decimals: int, tip: str):
    spin = QDoubleSpinBox()
    spin.setRange(lo, hi)
    spin.setDecimals(decimals)
    spin.setSingleStep(step)
    spin.setValue(value)
    spin.setToolTip(tip)
    spin.setAccessibleName(tip)
    return spin


def _hint(text: str, *, wrap: bool = True) -> QLabel:
    label = QLabel(text)
    label.setObjectName("HintLabel")
    label.setWordWrap(wrap)
    return label


def _scrolling(page: QWidget) -> QScrollArea:
    """`page` in a frameless vertical scroll area: its wrapped hints keep their full height
    when the dialog is shorter than the page (a small screen) instead of being cut."""
    area = QScrollArea()
    area.setWidget(page)
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return area


def _form(form: QFormLayout, *rows: tuple[str, QWidget | QHBoxLayout]) -> QFormLayout:
    """Add labelled rows to `form`."""
    for label, field in rows:
        form.addRow(label, field)
    return form


class SettingsDialog(QDialog):
    """Tabs: KV cache, Sampling, Appearance."""

    def __init__(
        self,
        cache: CacheSettings,
        sampling: SamplingSettings,
        theme_mode: str,
        default_system_prompt: str,
        parent: QWidget | None = None,
        *,
        model_sampling: SamplingSettings | None = None,
        use_model_sampling: bool = True,
        model_name: str = "",
    ) -> None:
        super().__init__(parent)
        self._config = cache.config  # fields not edited here (exact_below, ...) stay as they are
        self._sampling = sampling
        self._model_sampling = model_sampling
        self._model_name = model_name
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        self.result_value: SettingsResult | None = None
        tabs = QTabWidget()
        tabs.addTab(_scrolling(self._cache_tab(cache)), "KV cache")
        tabs.addTab(_scrolling(self._sampling_tab(sampling, use_model_sampling)), "Sampling")
        tabs.addTab(self._appearance_tab(theme_mode, default_system_prompt), "Appearance")
        self.error = QLabel()
        self.error.setObjectName("ErrorLabel")
        self.error.setTextFormat(Qt.TextFormat.PlainText)
        self.error.setWordWrap(True)
        self.error.hide()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            self.restore_defaults
        )
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.resize(self._opening_size(tabs))

    def _opening_size(self, tabs: QTabWidget) -> QSize:
        """As wide as the widest tab asks and tall enough for every wrapped hint of the tallest
        tab at that width (a top-level window does not grow for wrapped text by itself), but
        no larger than the screen's free area: past it the tabs scroll."""
        pages = [tabs.widget(i) for i in range(tabs.count())]
        inner = [p.widget() if isinstance(p, QScrollArea) else p for p in pages]
        bar = self.style().pixelMetric(self.style().PixelMetric.PM_ScrollBarExtent)
        width = max(w.sizeHint().width() for w in inner) + bar
        content = max(w.heightForWidth(width - bar) if w.hasHeightForWidth() else
                      w.sizeHint().height() for w in inner)  # fmt: skip
        around = self.sizeHint() - tabs.sizeHint()  # the error line, buttons and margins
        tab_bar = tabs.tabBar().sizeHint().height() + 2 * bar // 3  # the bar and the frame
        size = QSize(width + around.width(), content + tab_bar + around.height())
        size = size.expandedTo(self.minimumSizeHint())
        screen = self.screen()
        return size.boundedTo(screen.availableGeometry().size() * 0.9) if screen else size

    # ----- tabs ------------------------------------------------------------------------------

    def _cache_tab(self, cache: CacheSettings) -> QWidget:
        page = QWidget()
        self.a2ats = QCheckBox("Use the A2ATS cache (off = mlx-lm KVCache, for comparison)")
        self.a2ats.setChecked(cache.a2ats_enabled)
        self.a2ats.setAccessibleName("Use the A2ATS cache")
        self.window = _spin(1, 1 << 20, cache.config.window, "Exact-RoPE window (tokens)")
        self.far_offset = _spin(1, 1 << 24, cache.config.far_offset, FAR_OFFSET_TIP)
        self.sinks = _spin(0, 1 << 16, cache.config.sinks, "Attention sinks (tokens)")
        self.budget = _dspin(
            0.001,
            1.0,
            float(cache.config.budget),
            0.005,
            3,
            "Retrieval budget (fraction of the context per query head)",
        )
        self.min_k = _spin(1, 1 << 20, cache.config.min_k, "Minimum retrieved tokens")
        self.far_buckets = _spin(1, 64, cache.config.far_buckets, "Far distance buckets")
        self.far_buckets.valueChanged.connect(self._on_far_buckets_changed)
        self._on_far_buckets_changed(cache.config.far_buckets)
        self.rerank = _spin(1, 64, cache.config.rerank, "Rerank candidates per retrieved token")
        self.rerank.setToolTip(
            "1 = keep the top-K of the codebook scores (the paper). r > 1 = take the top r*K by "
            "codebook score, then keep the K whose stored keys score highest exactly."
        )
        self.estimate_missed = QComboBox()
        self.estimate_missed.setAccessibleName("Estimate the attention of the tokens not retrieved")
        for key, (label, _) in ESTIMATE_CHOICES.items():
            self.estimate_missed.addItem(label, key)
        self._set_estimate(cache.config.estimate_missed)
        self.estimate_missed.setToolTip(
            "Estimate the attention of the tokens not retrieved: folds them into the softmax "
            "through their codebook slots, each scored by the mean of its own keys: perplexity "
            "1.025x -> 1.008x full at 4K on the demo model (three texts), for a slower "
            "retrieval step (about 8% at 8K on a 2-core CPU) on the demo's 30 layers, nothing "
            "measurable on Gemma 3 270M's 3, and larger per-slot sums (docs/BENCHMARKS.md "
            "sections 1 and 2). \u201cWhere it costs nothing here\u201d: on every layer where "
            "the measurement of where retrieval pays off (made the first time a model is "
            "loaded) timed it at 0.95x the speed or more, else on the layers that miss most, as "
            "many as keep that speed (on a 2-core CPU 10 of the demo's 30; on 11, perplexity "
            "1.011x full at 4K instead of 1.025x, for no speed a run can see at 8K). Inspector > "
            "Fidelity shows the estimated mass."
        )
        self.preset = QComboBox()
        self.preset.setAccessibleName("Retrieval preset")
        for name, label in PRESET_LABELS.items():
            self.preset.addItem(label, name)
        self.preset.model().item(self.preset.findData(None)).setEnabled(False)  # a state only
        self.preset_help = _hint(PRESET_HELP)
        self.preset.currentIndexChanged.connect(self._on_preset_chosen)
        self.rerank.valueChanged.connect(self._show_preset)
        self.estimate_missed.currentIndexChanged.connect(self._show_preset)
        self._show_preset()
        self.kv_bits = QComboBox()
        self.kv_bits.setAccessibleName("Stored K/V precision")
        for label, bits in KV_BITS:
            self.kv_bits.addItem(label, bits)
        self.kv_bits.setCurrentIndex([b for _, b in KV_BITS].index(cache.config.kv_bits))
        self.kv_memory = _spin(-1, 1 << 24, _mib(cache.config.kv_memory), "K/V memory limit (MB)")
        self.kv_memory.setSpecialValueText("no limit")
        self.kv_memory.setSuffix(" MB")
        self.kv_memory.setToolTip(KV_MEMORY_HELP)
        self.kv_memory.valueChanged.connect(self._on_kv_memory_changed)
        self._on_kv_memory_changed(self.kv_memory.value())
        self.fidelity_every = _spin(
            0, 1 << 16, cache.config.fidelity_every, "Fidelity check every k decode steps (0 = off)"
        )
        self.fidelity_every.setSpecialValueText("off")
        self.fidelity_every.setToolTip(
            "Every k-th step a shadow exact attention measures the attention mass the selection "
            "recalled, per layer (Inspector > Fidelity). Costs a full attention pass per check."
        )
        group = QGroupBox("Retrieval")
        self.kv_bits_help = _hint(KV_BITS_HELP)
        _form(
            QFormLayout(group),
            ("Window", self.window),
            ("Far offset (b)", self.far_offset),
            ("Sinks", self.sinks),
            ("Budget", self.budget),
            ("Min retrieved", self.min_k),
            ("Distance buckets", self.far_buckets),
            ("Preset", self.preset),
            ("", self.preset_help),
            ("Rerank", self.rerank),
            ("Missed attention", self.estimate_missed),
            ("K/V storage", self.kv_bits),
            ("", self.kv_bits_help),
            ("K/V memory limit", self.kv_memory),
            ("Fidelity check every", self.fidelity_every),
        )
        note = _hint(NEXT_MESSAGE_NOTE)
        self.a2ats.toggled.connect(group.setEnabled)
        group.setEnabled(cache.a2ats_enabled)
        layout = QVBoxLayout(page)
        layout.addWidget(self.a2ats)
        layout.addWidget(group)
        layout.addWidget(note)
        layout.addStretch(1)
        return page

    def _show_preset(self, *_: object) -> None:
        """The Preset box names the preset the fields make (its rerank and estimate), else
        Custom (the only time Custom shows: it is not a choice)."""
        shown = {"rerank": self.rerank.value(), "estimate_missed": self._estimate()}
        name = preset_of(replace(self._config, **shown))
        self.preset.blockSignals(True)
        self.preset.setCurrentIndex(self.preset.findData(name))
        self.preset.blockSignals(False)

    def _on_preset_chosen(self, index: int) -> None:
        """Choosing a preset sets its fields (the rerank and the estimate, with its slot
        scoring); choosing Custom changes nothing."""
        name = self.preset.itemData(index)
        if name is None:
            return
        self._config = with_preset(self._config, name)
        self.rerank.setValue(self._config.rerank)
        self._set_estimate(self._config.estimate_missed)
        self._show_preset()

    def _estimate(self) -> bool | None:
        """The estimate's choice as `A2ATSConfig.estimate_missed` (None: where measured free)."""
        return ESTIMATE_CHOICES[self.estimate_missed.currentData()][1]

    def _set_estimate(self, value: bool | None) -> None:
        self.estimate_missed.setCurrentIndex(self.estimate_missed.findData(ESTIMATE_KEYS[value]))

    def _on_far_buckets_changed(self, buckets: int) -> None:
        """b is used only with one distance bucket: disable it (and say why) otherwise."""
        self.far_offset.setEnabled(buckets == 1)
        self.far_offset.setToolTip(FAR_OFFSET_TIP if buckets == 1 else FAR_OFFSET_IGNORED_TIP)

    def _on_kv_memory_changed(self, mib: int) -> None:
        """A limit keeps rows in the model dtype: K/V storage is full precision then."""
        limited = mib >= 0
        if limited:
            self.kv_bits.setCurrentIndex([b for _, b in KV_BITS].index(None))
        self.kv_bits.setEnabled(not limited)
        self.kv_bits.setToolTip(
            "Full precision while a K/V memory limit is set (the file keeps the model dtype)"
            if limited
            else ""
        )

    def _sampling_tab(self, sampling: SamplingSettings, use_model: bool) -> QWidget:
        page = QWidget()
        # Ranges follow SamplingSettings: top_p in (0, 1], min_p in [0, 1), penalty > 0.
        self.temperature = _dspin(0.0, 5.0, sampling.temperature, 0.05, 2, "Temperature")
        self.top_p = _dspin(0.01, 1.0, sampling.top_p, 0.01, 2, "Top p")
        self.min_p = _dspin(0.0, 0.99, sampling.min_p, 0.01, 2, "Min p")
        self.top_k = _spin(0, 1_000_000, sampling.top_k, "Top k (0 = off)")
        self.repetition_penalty = _dspin(
            0.05, 10.0, sampling.repetition_penalty, 0.05, 2, "Repetition penalty"
        )
        self.max_tokens = _spin(1, 1_000_000, sampling.max_tokens, "Maximum reply tokens")
        self.fixed_seed = QCheckBox("Fixed seed")
        self.fixed_seed.setChecked(sampling.seed is not None)
        self.seed = _spin(0, 2**31 - 1, sampling.seed or 0, "Seed")
        self.seed.setEnabled(sampling.seed is not None)
        self.fixed_seed.toggled.connect(self.seed.setEnabled)
        seed_row = QHBoxLayout()
        seed_row.addWidget(self.fixed_seed)
        seed_row.addWidget(self.seed, 1)
        self.use_model = QCheckBox("Use the model's recommended sampling")
        self.use_model.setAccessibleName("Use the model's recommended sampling")
        self.model_default = QLabel()
        self.model_default.setObjectName("HintLabel")
        self.model_default.setTextFormat(Qt.TextFormat.PlainText)  # model names are untrusted
        self.model_default.setWordWrap(True)
        self.model_default.setText(self._model_default_text())
        self._own = {name: getattr(sampling, name) for name in MODEL_SAMPLING_FIELDS}
        form = QFormLayout(page)
        form.addRow(self.use_model)
        form.addRow(self.model_default)
        _form(
            form,
            ("Temperature", self.temperature),
            ("Top p", self.top_p),
            ("Min p", self.min_p),
            ("Top k", self.top_k),
            ("Repetition penalty", self.repetition_penalty),
            ("Max tokens", self.max_tokens),
            ("Seed", seed_row),
        )
        form.addRow(_hint("Sampling changes also apply to the next message.", wrap=False))
        self.use_model.setChecked(use_model)
        self.use_model.toggled.connect(self._on_use_model_changed)
        self._on_use_model_changed(use_model)
        return page

    def _model_default_text(self) -> str:
        name = self._model_name or "The model"
        if self._model_sampling is None:
            if not self._model_name:
                return "No model loaded: the values below apply."
            return f"{name} recommends no sampling: the values below apply."
        return f"Model default ({name}): {describe_sampling(self._model_sampling)}."

    def _model_spins(self) -> dict:
        """The spin box of each sampling field a model may recommend (named as the field)."""
        return {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}

    def _config_spins(self) -> dict:
        """The spin box of each numeric A2ATSConfig field edited as it is (named as the field)."""
        return {name: getattr(self, name) for name in CONFIG_SPINS}

    def _showing_model_values(self) -> bool:
        return self.use_model.isChecked() and self._model_sampling is not None

    def _on_use_model_changed(self, use_model: bool) -> None:
        """Checked: the fields show the model's values, read-only (the user's are kept aside).
        Unchecked: the user's own values, editable."""
        showing_model = use_model and self._model_sampling is not None
        for name, spin in self._model_spins().items():
            if showing_model and spin.isEnabled():
                self._own[name] = spin.value()
            source = getattr(self._model_sampling, name) if showing_model else self._own[name]
            spin.setValue(source)
            spin.setEnabled(not showing_model)

    def _appearance_tab(self, theme_mode: str, default_system_prompt: str) -> QWidget:
        page = QWidget()
        self.theme_combo = QComboBox()
        self.theme_combo.setAccessibleName("Theme")
        for mode in THEMES:
            self.theme_combo.addItem(
                {"system": "Follow the system"}.get(mode, mode.capitalize()), mode
            )
        self.theme_combo.setCurrentIndex(THEMES.index(theme_mode))
        self.system_prompt = QPlainTextEdit(default_system_prompt)
        self.system_prompt.setAccessibleName("Default system prompt for new chats")
        self.system_prompt.setPlaceholderText("Used for new chats (each chat can change its own).")
        self.system_prompt.setFixedHeight(90)
        form = QFormLayout(page)
        form.addRow("Theme", self.theme_combo)
        form.addRow("Default system prompt", self.system_prompt)
        return page

    # ----- values ----------------------------------------------------------------------------

    def values(self) -> SettingsResult:
        """The edited settings; ValueError (naming the field) if something is out of range."""
        spins = {name: spin.value() for name, spin in self._config_spins().items()}
        spins["budget"] = round(spins["budget"], 6)
        config = replace(
            self._config,
            **spins,
            estimate_missed=self._estimate(),
            kv_bits=self.kv_bits.currentData(),
            kv_memory=None if self.kv_memory.value() < 0 else self.kv_memory.value() * 2**20,
        )  # A2ATSConfig validates: ValueError naming the field
        cache = CacheSettings(self.a2ats.isChecked(), config)
        own = dict(self._own)
        if not self._showing_model_values():
            own = {name: spin.value() for name, spin in self._model_spins().items()}
        sampling = replace(
            self._sampling,
            temperature=round(float(own["temperature"]), 4),
            top_p=round(float(own["top_p"]), 4),
            min_p=round(float(own["min_p"]), 4),
            top_k=int(own["top_k"]),
            repetition_penalty=round(float(own["repetition_penalty"]), 4),
            seed=self.seed.value() if self.fixed_seed.isChecked() else None,
            max_tokens=self.max_tokens.value(),
        )  # SamplingSettings validates: ValueError naming the field
        return SettingsResult(
            cache,
            sampling,
            self.theme_combo.currentData(),
            self.system_prompt.toPlainText(),
            self.use_model.isChecked(),
        )

    def restore_defaults(self) -> None:
        cache, sampling = CacheSettings(), SamplingSettings()
        self.a2ats.setChecked(cache.a2ats_enabled)
        for name, spin in self._config_spins().items():
            spin.setValue(getattr(cache.config, name))
        self._set_estimate(cache.config.estimate_missed)
        self._show_preset()
        self.kv_bits.setCurrentIndex([b for _, b in KV_BITS].index(cache.config.kv_bits))
        self.kv_memory.setValue(_mib(cache.config.kv_memory))
        self._own = {name: getattr(sampling, name) for name in MODEL_SAMPLING_FIELDS}
        self.use_model.setChecked(True)
        self._on_use_model_changed(True)  # shows the model's values, or the defaults
        self.max_tokens.setValue(sampling.max_tokens)
        self.fixed_seed.setChecked(False)

    def accept(self) -> None:
        try:
            self.result_value = self.values()
        except ValueError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()
