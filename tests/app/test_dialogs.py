"""Dialogs and look: settings validation, calibration form, HF repo ids, ETA, theme, icons."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QAbstractButton

from a2ats_engine.records import SamplingSettings
from app.dialogs.calibrate_dialog import CalibrateDialog, default_codebook_path
from app.dialogs.hf_dialog import HuggingFaceDialog, valid_repo_id
from app.dialogs.progress import EtaTracker, format_eta
from app.dialogs.settings_dialog import SettingsDialog
from app.settings import CacheSettings
from app.theme import DARK, LIGHT, resources_dir, theme

from .helpers import cut_labels


def test_settings_dialog_round_trips_and_restores_defaults(qtbot):
    cache = CacheSettings.of(a2ats_enabled=False, window=32, far_offset=1024, sinks=4,
                          budget=0.05, min_k=8, far_buckets=2, rerank=3, kv_bits=8)  # fmt: skip
    sampling = SamplingSettings(temperature=0.2, top_p=0.9, top_k=40, seed=11, max_tokens=99)
    dialog = SettingsDialog(cache, sampling, "dark", "Be brief.")
    qtbot.addWidget(dialog)
    values = dialog.values()
    assert values.cache == cache and values.sampling == sampling
    assert values.theme == "dark" and values.default_system_prompt == "Be brief."
    dialog.restore_defaults()
    assert dialog.values().cache == CacheSettings()
    assert dialog.values().sampling == SamplingSettings()


def test_settings_dialog_keeps_open_on_invalid_values(qtbot):
    dialog = SettingsDialog(CacheSettings(), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    dialog.top_p.setMaximum(5.0)
    dialog.top_p.setValue(3.0)  # outside SamplingSettings' range
    dialog.accept()
    assert dialog.result_value is None and "top_p" in dialog.error.text()
    dialog.top_p.setValue(0.5)
    dialog.accept()
    assert dialog.result_value.sampling.top_p == 0.5


def test_calibrate_dialog_request(qtbot, tmp_path):
    dialog = CalibrateDialog("Tiny LM", tmp_path)
    qtbot.addWidget(dialog)
    assert dialog.output.text() == str(default_codebook_path(tmp_path, "Tiny LM", 1024))
    assert dialog.output.text().endswith("Tiny-LM-1024c.safetensors")
    request = dialog.request()
    assert request.files == () and request.n_centroids == 1024 and request.beta == 0.0
    dialog.from_files.setChecked(True)
    with pytest.raises(ValueError, match="corpus file"):
        dialog.request()
    dialog.files.addItem(str(tmp_path / "a.txt"))
    assert dialog.request().files == (str(tmp_path / "a.txt"),)


@pytest.mark.parametrize(
    ("text", "ok"),
    [("mlx-community/SmolLM2-135M-Instruct", True), ("org/name", True), ("name", False),
     ("org/name/extra", False), ("/abs/path", False), ("", False)],
)  # fmt: skip
def test_repo_id_validation(qtbot, text, ok):
    assert valid_repo_id(text) is ok
    dialog = HuggingFaceDialog()
    qtbot.addWidget(dialog)
    dialog.repo.setText(text)
    dialog.accept()
    assert (dialog.result() == HuggingFaceDialog.DialogCode.Accepted) is ok
    assert dialog.error.isHidden() is ok


def test_eta_from_stage_rate():
    now = [0.0]
    eta = EtaTracker(clock=lambda: now[0])
    assert eta.update("collecting", 0, 100) is None
    now[0] = 10.0
    assert eta.update("collecting", 25, 100) == pytest.approx(30.0)
    now[0] = 11.0
    assert eta.update("clustering", 0, 20) is None  # a new stage restarts the estimate
    assert format_eta(30.2) == "about 30 s left" and format_eta(None) == "estimating\u2026"
    assert format_eta(125) == "about 2 min 05 s left"


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_theme_fills_every_placeholder_and_icons_render(qtbot, mode):
    from PySide6.QtWidgets import QApplication

    theme().apply(mode)
    sheet = QApplication.instance().styleSheet()
    assert sheet and "$" not in sheet
    assert theme().dark is (mode == "dark")
    for svg in (resources_dir() / "icons").glob("*.svg"):
        icon = theme().icon(svg.stem)
        image = icon.pixmap(24, 24).toImage()
        assert not icon.isNull()
        assert any(image.pixelColor(x, y).alpha() > 0 for x in range(24) for y in range(24)), svg
    theme().apply("light")


def test_palettes_define_the_same_colours():
    assert LIGHT.keys() == DARK.keys()


def test_every_control_of_the_main_window_is_named(make_window):
    from .fakes import FakeBackend

    window = make_window(FakeBackend())
    unnamed = [
        b for b in window.findChildren(QAbstractButton)
        if b.isVisibleTo(window) and not (b.accessibleName() or b.text().strip())
    ]  # fmt: skip
    assert unnamed == []
    assert window.composer.edit.accessibleName() == "Message input"
    assert window.chat_view.scroll.accessibleName() == "Conversation transcript"


def test_settings_dialog_disables_far_offset_when_buckets_ignore_it(qtbot):
    dialog = SettingsDialog(CacheSettings.of(far_buckets=4), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert not dialog.far_offset.isEnabled()
    assert "Not used with more than one distance bucket" in dialog.far_offset.toolTip()
    dialog.far_buckets.setValue(1)
    assert dialog.far_offset.isEnabled() and "Not used" not in dialog.far_offset.toolTip()
    dialog.far_offset.setValue(1024)
    dialog.far_buckets.setValue(2)
    assert not dialog.far_offset.isEnabled()
    assert dialog.values().cache.config.far_offset == 1024  # kept, just not used


# ----- untrusted strings stay inert ----------------------------------------------------------

HOSTILE = '<img src="file:///etc/passwd"> <b>bold</b> & <a href="smb://x">y</a>\nline two'


def _shown_text(rich_or_plain: str) -> str:
    """What Qt displays for a tooltip / message text (it guesses rich text like this)."""
    from PySide6.QtGui import Qt, QTextDocument

    doc = QTextDocument()
    if Qt.mightBeRichText(rich_or_plain):
        doc.setHtml(rich_or_plain)
    else:
        doc.setPlainText(rich_or_plain)
    return doc.toPlainText()


def test_rich_from_plain_shows_markup_verbatim():
    from app.inert_text import rich_from_plain

    assert _shown_text(HOSTILE) != HOSTILE  # what Qt would do with the raw string
    assert _shown_text(rich_from_plain(HOSTILE)) == HOSTILE
    assert rich_from_plain("") == ""


def test_message_stats_and_tooltip_are_plain(qtbot):
    from PySide6.QtCore import Qt

    from app.chat.message_widget import MessageWidget
    from app.conversations import Message

    provenance = {"model": {"name": HOSTILE}, "cache": {"a2ats_enabled": True}}
    widget = MessageWidget(Message("assistant", "hi", provenance=provenance))
    qtbot.addWidget(widget)
    assert widget.stats.textFormat() == Qt.TextFormat.PlainText
    assert widget.note.textFormat() == Qt.TextFormat.PlainText
    assert HOSTILE in _shown_text(widget.stats.toolTip())


def test_conversation_list_tooltip_shows_the_title_verbatim(qtbot):
    from app.chat.conversation_list import ConversationList
    from app.conversations import Conversation

    widget = ConversationList()
    qtbot.addWidget(widget)
    widget.set_conversations([Conversation(title=HOSTILE)], None)
    assert _shown_text(widget.list.item(0).toolTip()) == HOSTILE


def test_codebook_info_and_progress_labels_are_plain(qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel

    from app.dialogs.codebook_info import CodebookInfoDialog
    from app.dialogs.progress import ProgressPanel
    from app.events import CodebookLoaded

    info = CodebookLoaded(HOSTILE, HOSTILE, "0" * 64, 16, 8, None, 2, 1, {"corpus": HOSTILE})
    dialog = CodebookInfoDialog(info)
    qtbot.addWidget(dialog)
    labels = [w for w in dialog.findChildren(QLabel) if w.text() == HOSTILE]
    assert len(labels) == 2
    assert all(label.textFormat() == Qt.TextFormat.PlainText for label in labels)
    panel = ProgressPanel()
    qtbot.addWidget(panel)
    assert panel.stage.textFormat() == Qt.TextFormat.PlainText


# ----- sampling: the engine's SamplingSettings, the model's defaults ---------------------------


def test_the_dialog_never_accepts_what_the_engine_refuses(qtbot):
    dialog = SettingsDialog(CacheSettings(), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert dialog.top_p.minimum() > 0 and dialog.min_p.maximum() < 1  # the widgets' ranges
    dialog.use_model.setChecked(False)
    for spin, value, field in ((dialog.top_p, 0.0, "top_p"), (dialog.min_p, 1.0, "min_p")):
        spin.setRange(0.0, 1.0)
        spin.setValue(value)
        dialog.accept()
        assert dialog.result_value is None and field in dialog.error.text()
        spin.setValue(0.5)
    dialog.accept()
    assert isinstance(dialog.result_value.sampling, SamplingSettings)


def test_the_dialog_shows_the_models_default_and_lets_the_user_override_it(qtbot):
    own = SamplingSettings(temperature=0.8, top_p=0.7, max_tokens=77)
    model = SamplingSettings(temperature=0.0, top_k=20)
    dialog = SettingsDialog(CacheSettings(), own, "system", "", model_sampling=model,
                            use_model_sampling=True, model_name="<b>Tiny</b>")  # fmt: skip
    qtbot.addWidget(dialog)
    text = dialog.model_default.text()
    assert "<b>Tiny</b>" in text and "temperature 0 (greedy)" in text and "top k 20" in text
    assert dialog.temperature.value() == 0.0 and not dialog.temperature.isEnabled()
    assert dialog.top_k.value() == 20
    values = dialog.values()
    assert values.use_model_sampling and values.sampling == own  # the user's values kept aside
    dialog.use_model.setChecked(False)  # override
    assert dialog.temperature.isEnabled() and dialog.temperature.value() == 0.8
    dialog.temperature.setValue(1.2)
    values = dialog.values()
    assert not values.use_model_sampling
    assert values.sampling == SamplingSettings(temperature=1.2, top_p=0.7, max_tokens=77)
    dialog.restore_defaults()  # "use the model's defaults" again
    assert dialog.use_model.isChecked() and dialog.temperature.value() == 0.0
    assert dialog.values().use_model_sampling


def test_without_a_recommendation_the_users_values_are_editable(qtbot):
    own = SamplingSettings(temperature=0.4)
    dialog = SettingsDialog(CacheSettings(), own, "system", "", model_name="Plain")
    qtbot.addWidget(dialog)
    assert "Plain recommends no sampling" in dialog.model_default.text()
    assert dialog.temperature.isEnabled() and dialog.temperature.value() == 0.4
    assert dialog.values().sampling == own


def test_inspector_status_line_tooltip_shows_token_text_verbatim(qtbot):
    from app.inspector.widgets import StatusLine

    line = StatusLine()
    qtbot.addWidget(line)
    line.setText(HOSTILE)
    assert line.text() == HOSTILE and _shown_text(line.toolTip()) == HOSTILE


def test_settings_dialog_says_what_each_kv_storage_costs(qtbot):
    # the figures are the recorded runs' (docs/benchmarks): ppl vs full from `a2ats eval
    # --kv-bits`, bytes vs an fp16 cache from `a2ats bench memory`
    import json
    from pathlib import Path

    from app.dialogs.settings_dialog import KV_BITS_HELP

    bench = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
    mem = json.loads((bench / "memory.json").read_text())
    per = {r["method"]: r["vs_fp16_full"] for r in mem["results"] if r["context"] == 4096}
    for run, method in (("_float", "a2ats"), ("8", "a2ats_kv8"), ("4", "a2ats_kv4")):
        ev = json.loads((bench / f"eval_4k_kv{run}.json").read_text())
        assert f"ppl {ev['methods']['a2ats']['ppl_vs_full']:.3f}x" in KV_BITS_HELP
        if method != "a2ats":
            assert f"{per[method]:.2f}x an fp16 cache" in KV_BITS_HELP
    assert "2x an fp16 cache" in KV_BITS_HELP and round(per["a2ats"]) == 2
    assert "full precision on CPU-only MLX, 8-bit on Metal" in KV_BITS_HELP
    dialog = SettingsDialog(CacheSettings(), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert dialog.kv_bits_help.text() == KV_BITS_HELP


def choose_estimate(dialog, key: str) -> None:
    dialog.estimate_missed.setCurrentIndex(dialog.estimate_missed.findData(key))


def test_the_missed_attention_estimate_is_left_to_the_measurement_by_default(qtbot):
    """Three choices: where it costs nothing here (measured; the default, None), on, off."""
    dialog = SettingsDialog(CacheSettings(), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert dialog.estimate_missed.currentData() == "auto"
    assert dialog.estimate_missed.currentText().startswith("Where it costs nothing here")
    assert dialog.values().cache.to_config().estimate_missed is None
    choose_estimate(dialog, "on")
    assert dialog.values().cache.to_config().estimate_missed is True
    choose_estimate(dialog, "off")
    assert dialog.values().cache.to_config().estimate_missed is False
    tip = dialog.estimate_missed.toolTip()  # says what it buys, what it costs, what auto means
    assert "1.008x full" in tip and "slower retrieval step" in tip and "0.95x" in tip
    dialog.restore_defaults()
    assert dialog.estimate_missed.currentData() == "auto"
    off = CacheSettings.of(estimate_missed=False)
    reopened = SettingsDialog(off, SamplingSettings(), "system", "")
    qtbot.addWidget(reopened)
    assert reopened.estimate_missed.currentData() == "off"


def test_settings_dialog_sets_a_kv_memory_limit_with_full_precision_storage(qtbot):
    dialog = SettingsDialog(CacheSettings.of(kv_bits=8), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert dialog.kv_memory.text() == "no limit" and dialog.kv_bits.isEnabled()
    assert dialog.values().cache.config.kv_memory is None
    dialog.kv_memory.setValue(512)
    cache = dialog.values().cache
    assert cache.config.kv_memory == 512 * 2**20 and cache.config.kv_bits is None
    assert not dialog.kv_bits.isEnabled()
    assert cache.to_config().kv_memory == 512 * 2**20  # what the next message's cache gets
    dialog.kv_memory.setValue(-1)
    assert dialog.kv_bits.isEnabled() and dialog.values().cache.config.kv_memory is None
    reopened = SettingsDialog(cache, SamplingSettings(), "system", "")
    qtbot.addWidget(reopened)
    assert reopened.kv_memory.value() == 512 and not reopened.kv_bits.isEnabled()


def test_the_preset_box_sets_the_rerank_and_the_estimate_and_names_what_they_make(qtbot):
    """Choosing Quality sets rerank 4 and the estimate with mean slot scores (even over a
    config that held another scoring); another rerank, or the estimate unticked, shows Custom
    (not a choice); Speed and Restore Defaults give the default config back; the help quotes
    the recorded runs (tests/test_docs_figures.py)."""
    from a2ats_engine.cache.config import preset_of
    from app.dialogs.settings_dialog import PRESET_HELP

    held = CacheSettings.of(estimate_scores="code_mean")
    dialog = SettingsDialog(held, SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    assert dialog.preset.currentData() == "speed"
    assert dialog.estimate_missed.currentData() == "auto"
    custom = dialog.preset.findData(None)
    assert not dialog.preset.model().item(custom).isEnabled()
    dialog.preset.setCurrentIndex(dialog.preset.findData("quality"))
    assert dialog.rerank.value() == 4 and dialog.estimate_missed.currentData() == "on"
    config = dialog.values().cache.to_config()
    assert (config.rerank, config.estimate_missed, config.estimate_scores) == (4, True, "mean")
    assert preset_of(config) == "quality"
    dialog.rerank.setValue(3)
    assert dialog.preset.currentData() is None and dialog.preset.currentText() == "Custom"
    assert dialog.values().cache.to_config().rerank == 3  # the user's value, kept
    dialog.rerank.setValue(4)
    assert dialog.preset.currentData() == "quality"
    choose_estimate(dialog, "off")
    assert dialog.preset.currentData() is None  # rerank 4 without the estimate: custom
    assert dialog.values().cache.to_config().estimate_missed is False
    choose_estimate(dialog, "on")
    assert dialog.preset.currentData() == "quality"
    dialog.preset.setCurrentIndex(dialog.preset.findData("speed"))
    assert dialog.estimate_missed.currentData() == "auto" and dialog.rerank.value() == 2
    assert preset_of(dialog.values().cache.to_config()) == "speed"
    dialog.preset.setCurrentIndex(dialog.preset.findData("quality"))
    dialog.restore_defaults()
    assert dialog.preset.currentData() == "speed"
    assert dialog.values().cache.to_config().estimate_missed is None
    assert dialog.preset_help.text() == PRESET_HELP
    quality = CacheSettings.of(rerank=4, estimate_missed=True)
    reopened = SettingsDialog(quality, SamplingSettings(), "system", "")
    qtbot.addWidget(reopened)
    assert reopened.preset.currentData() == "quality"
    alone = SettingsDialog(CacheSettings.of(rerank=4), SamplingSettings(), "system", "")
    qtbot.addWidget(alone)
    assert alone.preset.currentData() is None  # rerank 4 alone is no longer a preset


def test_settings_dialog_shows_every_label_whole(qtbot):
    """The hints under Preset and K/V storage are paragraphs: opened on a small screen the
    dialog must not squeeze them to a line (a top-level window does not grow for wrapped text
    by itself); every label of every tab fits, and the tab scrolls if the screen is too short."""
    from PySide6.QtWidgets import QLabel, QTabWidget

    dialog = SettingsDialog(CacheSettings(), SamplingSettings(), "system", "")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    screen = dialog.screen().availableGeometry()
    assert dialog.width() <= screen.width() and dialog.height() <= screen.height()
    tabs = dialog.findChild(QTabWidget)
    for i in range(tabs.count()):
        tabs.setCurrentIndex(i)
        qtbot.wait(1)
        assert tabs.widget(i).findChildren(QLabel)
        assert not cut_labels(tabs.widget(i)), cut_labels(tabs.widget(i))
    assert dialog.preset_help.height() > 2 * dialog.preset_help.fontMetrics().height()
