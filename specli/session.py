"""A loaded pair, and `engine_for`, the one place a generation is built.

The session holds load-time facts only: the target, a draft model (with its KV cache),
whether it drafts through text, the target's NextN layers (with their caches) where MTP
drafting was asked for, the exact verify batches, what the target's KV cache holds, and the
pair's pricing (specli/pricing/). A GenerationRequest says everything else; `engine_for`
turns it into the proposer, the draft-length policy and the engine that run it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from specli.decode.adaptive import MAX_DRAFT, AdaptiveDraftPolicy
from specli.decode.constraint import Matcher, Vocabulary
from specli.decode.costs import VerifyCurve
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine, EngineOptions, TargetCache
from specli.decode.exact import BatchCap
from specli.decode.mtp import MtpProposer, NextnDraft
from specli.decode.ngram import NGramProposer, TokenIndex
from specli.decode.policy import DraftPolicy, FixedDraftPolicy
from specli.decode.proposers import LookupThenModel, NoProposer, Proposer
from specli.decode.request import AUTO, DraftKind, GenerationRequest
from specli.decode.shapes import GPU_SIZES
from specli.decode.translate import TranslatedDraft
from specli.errors import MtpUnavailableError, UsageError, VocabMismatchError
from specli.llama import mtp
from specli.llama.backend import LoadSettings, Model
from specli.llama.vocab import check_vocab_compatible
from specli.pricing import Pricing, exact_caps


@dataclass(frozen=True)
class SessionSpec:
    """What to load, and how."""

    target: Path
    draft_model: Path | None = None
    target_load: LoadSettings = LoadSettings()
    draft_load: LoadSettings = LoadSettings()
    # Load for exact decoding: measure (or read) which verify batches give one-token logits
    # bit for bit along the context, with repacking on and off, and load with the setting
    # that allows more.
    exact: bool = False
    # Greedy runs without a repetition penalty verify on the device (Engine's verify_on_device).
    verify_on_device: bool = False
    verbose: bool = False
    chat_template: str | None = None  # --chat-template-file: the template's text, in place of the GGUF's
    # Open the target's NextN layers to draft with (--draft mtp, or a server whose requests may ask).
    mtp: bool = False


class Session:
    """A loaded target, and a draft model or the target's NextN layers where they were asked
    for, reusable across generations."""

    def __init__(self, spec: SessionSpec, target: Model, draft: DraftModel | None = None, *, translated: bool = False,
                 exact_cap: BatchCap | None = None, notice: Callable[[str], None] | None = None,
                 nextn: NextnDraft | None = None) -> None:
        self.spec = spec
        self.target = target
        self.draft = draft
        self.nextn = nextn  # the target's NextN layers and their caches (MTP drafting)
        self.translated = translated  # the draft model's vocabulary is not the target's: it drafts through text
        self.pricing = Pricing(spec, target, draft, translated=translated, notice=notice, nextn=nextn)
        self._exact_cap = exact_cap
        self._cache = TargetCache()  # what the target's KV cache holds, across generations
        self._vocabulary: Vocabulary | None = None  # the target's tokens for constraints, built when first needed

    @property
    def exact_cap(self) -> BatchCap | None:
        """The verify batches that give one-token logits bit for bit, by position, if measured."""
        return self._exact_cap

    def exact(self) -> BatchCap:
        """The exact verify batches for the loaded repacking setting: measured at load with
        spec.exact, else now (once per model and settings, then stored)."""
        if self._exact_cap is None:
            repack = self.spec.target_load.repack
            self._exact_cap = exact_caps(self.spec, repacks=(repack,))[repack]
        return self._exact_cap

    def engine_for(self, request: GenerationRequest, *, memory: TokenIndex | None = None) -> Engine:
        """The engine that runs `request` on the loaded models: its proposer and draft-length
        policy are built here and nowhere else. `memory`: recent outputs for lookup to search
        (the server's). What the target's and the draft model's caches hold is kept across
        engines, so a request that shares a prefix with the one before decodes only the rest."""
        request = request.seeded()
        matcher = Matcher(self.vocabulary(), request.constraint) if request.constraint is not None else None
        proposer = self._proposer(request, memory, matcher)
        policy = self._policy(request, proposer)
        drafting = not isinstance(proposer, NoProposer)
        cap = self.exact() if request.exact and drafting else BatchCap.anywhere(MAX_DRAFT + 1)
        reach = self.target.max_rewind  # a recurrent target takes back no more than its snapshots
        if drafting and reach is not None:
            cap = cap.within(reach + 1)
        by_model = drafting and self.draft is not None and request.draft is DraftKind.MODEL
        options = EngineOptions(self.spec.verify_on_device, cap,
                                self.spec.draft_model.name if by_model and self.spec.draft_model else "")
        return Engine(self.target, proposer, policy, request, cache=self._cache, matcher=matcher, options=options)

    def vocabulary(self) -> Vocabulary:
        """The target's tokens as a constraint reads them, built on the first constrained request."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.target)
        return self._vocabulary

    def clear_cache(self) -> None:
        """Forget what the target's KV cache holds: the next generation decodes its whole
        prompt, as a fresh `specli run` does (a prompt decoded on top of a kept prefix is
        batched otherwise, and rounds otherwise at a near-tie, even under --exact)."""
        self._cache = TargetCache(shapes=self._cache.shapes)  # the graph the target replays stays

    def plain_reason(self, request: GenerationRequest) -> str | None:
        """Why a request that drafts decodes plainly on this session (None: it drafts): the
        target cannot take a rejected draft back, or --exact finds no verify batch above one
        row exact."""
        if not request.drafts:
            return None
        if self.target.rewind_problem is not None:
            return f"{self.target.rewind_problem}: a rejected draft could not be taken back; decoding plainly"
        if request.exact and self.exact().largest == 1:
            return "--exact: no verify batch above one row gives one-token logits on this build; decoding plainly"
        return None

    def drafts_plainly(self, request: GenerationRequest) -> bool:
        return self.plain_reason(request) is not None

    def _max_draft(self, request: GenerationRequest) -> int:
        """The longest draft a step may verify: MAX_DRAFT, held to the largest --exact batch and
        to what a recurrent target's snapshots can take back (a rejected draft and padding rows)."""
        most = self.exact().largest - 1 if request.exact else MAX_DRAFT
        reach = self.target.max_rewind
        return most if reach is None else min(most, reach)

    def _proposer(self, request: GenerationRequest, memory: TokenIndex | None, matcher: Matcher | None) -> Proposer:
        if not request.drafts or self.drafts_plainly(request):
            return NoProposer()
        prediction = self.target.tokenize(request.prediction, add_special=False) if request.prediction else []
        lookup = NGramProposer(references=[memory] if memory is not None else [], prediction=prediction)
        if request.draft is DraftKind.NGRAM:
            return lookup
        model = self._model_proposer(request, matcher)
        # A prediction feeds lookup whatever the draft; without one, --no-ngram is honoured.
        return LookupThenModel(lookup, model) if request.lookup or prediction else model

    def _model_proposer(self, request: GenerationRequest, matcher: Matcher | None) -> Proposer:
        """The target's NextN layers (draft 'mtp'), or the draft model, for this request."""
        seed = request.seed or 0
        if request.draft is DraftKind.MTP:
            if self.nextn is None:
                raise MtpUnavailableError(f"draft 'mtp': {self.target.path.name}'s NextN layers were not opened",
                                          "load it with --draft mtp")
            return MtpProposer(self.nextn, request.sampling, seed, request.draft_min_p, constraint=matcher)
        if self.draft is None:
            raise UsageError("draft 'model': no draft model is loaded", "load one with --draft MODEL")
        # Through text its tokens are not the target's: the engine checks what it brings instead.
        model: Proposer = DraftModelProposer(self.draft, request.sampling, seed, request.draft_min_p,
                                             keyed=not self.translated, constraint=None if self.translated else matcher)
        return TranslatedDraft(self.target, model) if self.translated else model  # type: ignore[arg-type]

    def _policy(self, request: GenerationRequest, proposer: Proposer) -> DraftPolicy:
        """-k N: N draft tokens a step; -k auto: the adaptive policy, priced with the stored
        costs (the NextN layers' for draft 'mtp'). Never longer than the largest --exact batch
        (the engine caps each step where it is), or a recurrent target's snapshots, allow."""
        if isinstance(proposer, NoProposer):
            return FixedDraftPolicy(0)
        max_draft = self._max_draft(request)
        auto = request.draft_tokens == AUTO
        costs = self.pricing.costs(measure=auto, mtp=request.draft is DraftKind.MTP)
        if self.target.on_gpu:  # padding and changes of shape priced as the policy prices steps
            self._cache.shapes.priced(VerifyCurve(costs.verify), costs.change)
        if auto:
            return AdaptiveDraftPolicy(costs, prior=proposer.prior, max_draft=max_draft, shapes=self._cache.shapes)
        return FixedDraftPolicy(min(request.draft_tokens, max_draft))

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        if self.nextn is not None:
            self.nextn.close()  # before the target they read
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(spec: SessionSpec, notice: Callable[[str], None] | None = None) -> Session:
    """Load the target and the draft model. With spec.exact, first find (or read) the exact
    verify batches with repacking on and off, and load with the setting that allows more
    drafting (where no batch above one row is exact anywhere, no draft model is loaded:
    nothing can be drafted); `notice` hears of a measurement before it starts, and of a draft
    that drafts through text."""
    exact_cap = None
    if spec.exact:
        spec, exact_cap = _exact_settings(spec, notice)
    load = mtp.load_target if spec.mtp else mtp.load_model  # with NextN layers where the file holds them
    target = load(spec.target, spec.target_load, verbose=spec.verbose, chat_template=spec.chat_template)
    draft: DraftModel | None = None
    heads: mtp.MtpHeads | None = None
    try:
        translated = False
        if spec.draft_model is not None and (exact_cap is None or exact_cap.largest > 1):
            draft, translated = _open_draft(spec, target, notice)
        heads = mtp.MtpHeads(target) if spec.mtp else None
        session = Session(spec, target, draft, translated=translated, exact_cap=exact_cap, notice=notice,
                          nextn=NextnDraft(heads) if heads is not None else None)
        _warm_up(target, draft)
    except BaseException:
        if draft is not None:
            draft.close()
        if heads is not None:
            heads.close()
        target.close()
        raise
    return session


def _warm_up(target: Model, draft: DraftModel | None) -> None:
    """On a GPU, decode each verify batch size once, and a token on the draft model, before
    the first timed step: the first use of a size allocates and picks its kernels, which a
    fresh run would otherwise pay for inside its steps. Both caches are left empty."""
    if target.on_gpu:
        token = target.bos if target.bos >= 0 else 0
        for size in GPU_SIZES:
            if size < min(target.n_ctx, target.batch_size):
                target.decode([token] * size, all_logits=True)
                target.rewind(0)
    if draft is not None and draft.on_gpu:
        draft.forget()
        draft.choice_after([0, 0])
        draft.forget()


def _exact_settings(spec: SessionSpec, notice: Callable[[str], None] | None) -> tuple[SessionSpec, BatchCap]:
    caps = exact_caps(spec, notice)
    # The faster kernels where they allow as many draft tokens along the context.
    repack = caps[True].drafted_positions() >= caps[False].drafted_positions()
    spec = replace(spec, target_load=replace(spec.target_load, repack=repack),
                   draft_load=replace(spec.draft_load, repack=repack))
    return spec, caps[repack]


def _open_draft(spec: SessionSpec, target: Model, notice: Callable[[str], None] | None) -> tuple[DraftModel, bool]:
    """The draft model, and whether it drafts through text (its vocabulary fails llama.cpp's rule)."""
    assert spec.draft_model is not None
    draft = Model(spec.draft_model, spec.draft_load, verbose=spec.verbose)
    try:
        if draft.recurrent:  # its drafting decodes are one token each: no snapshot reaches back a draft
            raise UsageError(f"{spec.draft_model.name} has recurrent layers: this llama.cpp cannot take its "
                             "rejected draft tokens back", "draft with an attention-only model, --draft ngram or mtp")
        check_vocab_compatible(target, draft)
        return DraftModel(draft, on_gpu=draft.on_gpu), False
    except VocabMismatchError as refused:
        # Its tokens mean nothing to the target: it drafts through text instead.
        if notice is not None:
            notice(f"{refused.message}: drafting through text (the draft's tokens are re-tokenized for the target)")
        return DraftModel(draft, on_gpu=draft.on_gpu), True
    except BaseException:
        draft.close()
        raise
