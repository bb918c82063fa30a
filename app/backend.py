"""The seam between the worker and the engine: every call into a2ats_engine goes through here.

`EngineBackend` calls the real engine; tests may hand the worker a fake with the same
methods (a slowed generator, say). Only the engine thread calls these methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from a2ats_engine.progress import Progress as ProgressFn


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (the engine's `files.sha256_file`)."""
    from a2ats_engine.files import sha256_file

    return sha256_file(path)


class EngineBackend:
    """Real engine calls (MLX). Methods mirror INTERFACES.md."""

    def load_model(self, source: str, progress: ProgressFn | None = None):
        """-> (model, tokenizer, ModelInfo); ModelLoadError on bad input."""
        from a2ats_engine.loading.models import load_model

        return load_model(source, progress=progress)

    def demo_model_path(self) -> Path | None:
        from a2ats_engine.loading.models import demo_model_path

        return demo_model_path()

    def fetch_demo(self, progress: ProgressFn | None = None) -> Path:
        from a2ats_engine.loading.models import fetch_demo

        return fetch_demo(progress=progress)

    def load_codebook(self, path: str, model) -> tuple[Any, list[str]]:
        """-> (codebook, warnings); CodebookError naming the mismatch when it does not fit."""
        from a2ats_engine.cache.codebook import Codebook

        codebook = Codebook.load(path)
        warnings = codebook.validate_for(model)
        return codebook, list(warnings or [])

    def make_session(self, model, tokenizer, *, system_prompt, sampling, a2ats, codebook) -> Any:
        """A ChatSession; `a2ats` None = mlx-lm's KVCache."""
        from a2ats_engine.session import ChatSession

        return ChatSession(
            model,
            tokenizer,
            system_prompt=system_prompt or None,
            sampling=sampling,
            a2ats=a2ats,
            codebook=codebook,
        )

    def configure_session(self, session, *, a2ats, codebook) -> None:
        """Switch the cache kind for the next message (the session rebuilds its cache)."""
        if a2ats is None:
            session.set_cache_factory(None)
        else:
            session.set_cache_factory(a2ats=a2ats, codebook=codebook)

    def set_sampling(self, session, sampling) -> None:
        session.set_sampling(sampling)

    def context_token_ids(self, session, *, streaming: bool) -> list[int]:
        """Token ids of the session's context in position order. While a reply streams the
        session's cache ids are not updated yet, so the rendered prompt (which the stream
        prefilled) stands for them; generated tokens are added by the caller."""
        if streaming:
            return [int(t) for t in session.prompt_token_ids()]
        ids = getattr(session, "context_token_ids", None)
        if ids is None:
            ids = session.cached_token_ids
        return [int(t) for t in ids]

    def decode(self, tokenizer, ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def demo_codebook_path(self) -> Path:
        from a2ats_engine.calibration.calibrate import demo_codebook_path

        return demo_codebook_path()

    def calibrate(self, model, tokenizer, request, progress: ProgressFn, cancel, model_name: str):
        """Train a codebook as `request` (CalibrationRequest) asks, save it, return it.
        `cancel` is a threading.Event; the engine raises CalibrationCancelled when it is set."""
        from a2ats_engine.calibration.calibrate import calibrate
        from a2ats_engine.calibration.codebook_spec import CodebookSpec
        from a2ats_engine.calibration.corpus import load_texts

        texts = load_texts(list(request.files), tokenizer) if request.files else None
        spec = CodebookSpec(request.n_centroids, request.sub_dim, request.beta)
        codebook = calibrate(
            model,
            tokenizer,
            texts,
            request.cache.to_config(),
            spec=spec,
            tokens=request.tokens,
            progress=progress,
            cancel=cancel,
            model_name=model_name,
        )
        Path(request.output).parent.mkdir(parents=True, exist_ok=True)
        codebook.save(request.output)
        return codebook

    def is_cancellation(self, exc: BaseException) -> bool:
        from a2ats_engine.calibration.calibrate import CalibrationCancelled

        return isinstance(exc, CalibrationCancelled)

    def codebook_sha256(self, codebook, path: str) -> str:
        sha = getattr(codebook, "sha256", None)
        return sha if isinstance(sha, str) and sha else file_sha256(path)
