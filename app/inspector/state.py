"""What every inspector panel reads: kept snapshots, the viewed step, context token texts."""

from __future__ import annotations

from dataclasses import dataclass, field

from a2ats_engine.cache.layer_plan import LayerPlan

from .snapshot_ring import DEFAULT_CAPACITY, Entry, FrequencyTracker, SnapshotRing


@dataclass
class FidelityInfo:
    """Fidelity shadow pass settings and measured cost as the app reports them."""

    enabled: bool = False
    every: int | None = None  # a shadow pass every k-th decode step
    cost_ms: float | None = None  # measured extra milliseconds per measured step
    overhead: float | None = None  # measured tokens/s slowdown as a fraction (0.08 = 8%)


@dataclass
class InspectorState:
    """Shared, Qt-free model of the inspector. `viewed_seq` None means "the newest step".
    `plan`: the loaded model's layer plan (which layers are A2ATS, which native), None unknown."""

    ring: SnapshotRing = field(default_factory=lambda: SnapshotRing(DEFAULT_CAPACITY))
    tokens: list[str] = field(default_factory=list)
    viewed_seq: int | None = None
    fidelity: FidelityInfo = field(default_factory=FidelityInfo)
    plan: LayerPlan | None = None

    def __post_init__(self) -> None:
        self.frequency = FrequencyTracker(self.ring)

    @property
    def live(self) -> bool:
        return self.viewed_seq is None

    def entry(self, histograms: bool = False) -> Entry | None:
        """The viewed entry (newest when live; the oldest kept one if the viewed was dropped).

        Live, the newest entry is the engine's own record; `histograms` asks for it with its
        full code histograms (the engine sends most steps as new codes only)."""
        if not self.ring:
            return None
        if self.viewed_seq is None:
            newest = self.ring.at_index(len(self.ring) - 1)
            return self.ring.restored(newest) if histograms else newest
        return self.ring.restored(self.ring.at_index(self.ring.index_of(self.viewed_seq)))

    def token_text(self, position: int) -> str | None:
        if 0 <= position < len(self.tokens):
            return self.tokens[position]
        return None


def printable_token(text: str | None, limit: int = 24) -> str:
    """A token's text made visible: newlines and tabs as symbols, long texts shortened."""
    if text is None:
        return ""
    shown = text.replace("\n", "\u23ce").replace("\t", "\u21e5").replace("\r", "")
    if shown.strip() == "" and shown:
        shown = shown.replace(" ", "\u2423")
    if len(shown) > limit:
        shown = shown[: limit - 1] + "\u2026"
    return shown
