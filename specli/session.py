"""Wiring: load the target and the draft, check they fit together."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Union

import numpy as np

from specli.adaptive import CALIBRATION_SIZES, CALIBRATION_VERSION, AdaptiveDraftLength, VerifyCost, cached_calibration, calibrate
from specli.backend import LoadSettings, Model, check_vocab_compatible, library_versions
from specli.config import cache_dir
from specli.devices import compute_fingerprint
from specli.engine import DraftLength, Engine, FixedDraftLength, GenerationOptions
from specli.proposers import DraftModelProposer, NGramProposer, NoProposer, Proposer
from specli.sampling import SamplingSettings

DraftSpec = Union[Path, Literal["ngram", "none"]]


@dataclass(frozen=True)
class SessionSpec:
    target: Path
    draft: DraftSpec = "ngram"
    target_load: LoadSettings = LoadSettings()
    draft_load: LoadSettings = LoadSettings()
    sampling: SamplingSettings = SamplingSettings()
    seed: int | None = None
    draft_min_confidence: float = 0.0
    verbose: bool = False


@dataclass
class Session:
    """A loaded target and proposer, reusable across generations."""

    spec: SessionSpec
    target: Model
    proposer: Proposer
    rng: np.random.Generator = field(repr=False)
    seed: int = 0

    def engine(self, draft_length: DraftLength, options: GenerationOptions) -> Engine:
        return Engine(self.target, self.proposer, draft_length, options, self.rng)

    def draft_length(self, fixed_k: int | None, notice: Callable[[], None] | None = None) -> DraftLength:
        """A fixed K, or the adaptive policy primed with this target's verify-cost curve
        (`notice` is called before a calibration has to be measured)."""
        if fixed_k is not None:
            return FixedDraftLength(fixed_k)
        if self.proposer.name == "none":
            return FixedDraftLength(0)
        costs = VerifyCost(self.verify_costs(notice))
        return AdaptiveDraftLength(verify_cost=costs, prior=getattr(self.proposer, "prior", None))

    def verify_costs(self, notice: Callable[[], None] | None = None) -> dict[int, float]:
        """Seconds per all-logits decode by batch size, measured once per model and settings."""
        target, load = self.target, self.spec.target_load
        info = target.path.stat()
        sizes = tuple(size for size in CALIBRATION_SIZES if size < min(target.n_ctx, target.batch_size))
        key = "|".join(
            str(part)
            for part in (target.path.resolve(), info.st_size, info.st_mtime_ns, load.gpu_layers, load.threads,
                         load.repack, target.n_ctx, library_versions()["llama_cpp_python"], compute_fingerprint(),
                         ",".join(map(str, sizes)), f"v{CALIBRATION_VERSION}")
        )
        token = target.bos if target.bos >= 0 else 0

        def measure() -> dict[int, float]:
            if notice is not None:
                notice()
            target.rewind(0)
            return calibrate(lambda tokens: target.decode(tokens, all_logits=True), target.rewind, token, sizes)

        return cached_calibration(cache_dir() / "calibration.json", key, measure)

    def close(self) -> None:
        self.proposer.close()
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(spec: SessionSpec) -> Session:
    # One seed drives both the draft's sampling and the verifier's coin flips, from
    # independent streams, so a --seed run repeats exactly.
    seed = spec.seed if spec.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
    verify_rng = np.random.default_rng([seed, 0])
    draft_rng = np.random.default_rng([seed, 1])
    target = Model(spec.target, spec.target_load, verbose=spec.verbose)
    try:
        proposer = _open_proposer(spec, target, draft_rng)
    except BaseException:
        target.close()
        raise
    return Session(spec, target, proposer, verify_rng, seed)


def _open_proposer(spec: SessionSpec, target: Model, rng: np.random.Generator) -> Proposer:
    if spec.draft == "none":
        return NoProposer()
    if spec.draft == "ngram":
        return NGramProposer()
    draft = Model(spec.draft, spec.draft_load, verbose=spec.verbose)
    try:
        check_vocab_compatible(target, draft)
    except BaseException:
        draft.close()
        raise
    return DraftModelProposer(draft, spec.sampling, rng, spec.draft_min_confidence)
