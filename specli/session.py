"""A loaded pair, and `engine_for`, the one place a generation is built.

The session holds load-time facts only: the target, what each draft kind asked for drafts
with (`loaded`, by kind: a draft model with its KV cache, the target's NextN layers with
theirs; specli/drafts.py says what each kind loads and builds), the exact verify batches,
what the target's KV cache holds, and the pair's pricing (specli/pricing/). A
GenerationRequest says everything else; `engine_for` turns it into the proposer (through its
draft kind's record), the draft-length policy and the engine that run it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from specli import drafts
from specli.decode.adaptive import AdaptiveDraftPolicy
from specli.decode.constraint import Matcher, Vocabulary
from specli.decode.costs import VerifyCurve
from specli.decode.engine import Engine, EngineOptions, TargetCache
from specli.decode.exact import BatchCap
from specli.decode.ngram import NGramProposer, TokenIndex
from specli.decode.policy import MAX_DRAFT, DraftPolicy, FixedDraftPolicy
from specli.decode.proposers import LookupThenModel, NoProposer, Proposer
from specli.decode.request import AUTO, GenerationRequest
from specli.decode.shapes import GPU_SIZES
from specli.decode.slots import Slot, open_slots
from specli.errors import UsageError
from specli.llama import mtp, vision
from specli.llama.backend import LoadSettings, Model, release_threads
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
    # The draft kinds whose own things the session opens (specli/drafts.py: "mtp", the target's
    # NextN layers), besides the draft model, which draft_model names.
    loads: tuple[str, ...] = ()
    projector: Path | None = None  # --mmproj: what the target's prompts' images become (specli.llama.vision)
    nextn_file: Path | None = None  # --draft mtp-*.gguf: the MTP file of a trunk-only target (specli.llama.mtp)
    # A conversation's (chat, serve): a recurrent target keeps this many state checkpoints on the
    # host, so each turn decodes only what is new (Model.keep_checkpoints); not for exact requests.
    checkpoints: int = 0


class Session:
    """A loaded target, and what the draft kinds asked for draft with (a draft model, the
    target's NextN layers), reusable across generations."""

    def __init__(self, spec: SessionSpec, target: Model, loaded: dict[str, Any] | None = None, *,
                 exact_cap: BatchCap | None = None, notice: Callable[[str], None] | None = None,
                 projector: vision.Projector | None = None) -> None:
        self.spec = spec
        self.target = target
        self.projector = projector  # where the target takes images (spec.projector)
        self._notice = notice
        self.loaded = dict(loaded or {})  # by draft kind: what it drafts with (specli/drafts.py)
        self.pricing = Pricing(spec, target, self._drafters(), notice=notice)
        self._exact_cap = exact_cap  # measured at load with spec.exact, else by `exact()` when first asked
        self._cache = TargetCache()  # what the target's KV cache holds, across generations
        self._vocabulary: Vocabulary | None = None  # the target's tokens for constraints, built when first needed
        # target_load.sequences above 1: a slot per sequence, one decode a step for all (decode/slots.py).
        self.slots: list[Slot] = open_slots(target) if target.sequences > 1 else []
        # By draft kind: what it drafts with in each slot (drafts.Kind.in_slots), where it loads
        # anything and that drafts beside others.
        in_slots = {name: drafts.KINDS[name].in_slots(thing, self.slots)  # type: ignore[misc]
                    for name, thing in self.loaded.items() if self.slots and drafts.KINDS[name].in_slots}
        self._in_slots = {name: things for name, things in in_slots.items() if things is not None}

    def exact(self) -> BatchCap:
        """The verify batches exact by position for the loaded repacking setting: measured at
        load with spec.exact, else now (once, then stored). The one place the session gives them."""
        if self._exact_cap is None:
            repack = self.spec.target_load.repack
            self._exact_cap = exact_caps(self.spec, repacks=(repack,))[repack]
        return self._exact_cap

    def engine_for(self, request: GenerationRequest, *, memory: TokenIndex | None = None,
                   slot: Slot | None = None, images: bool = False) -> Engine:
        """The engine that runs `request` on the loaded models: its proposer (through its draft
        kind's record) and draft-length policy are built here and nowhere else. `memory`:
        recent outputs for lookup to search (the server's); `slot`: the target's sequence it
        runs in, beside others (run it inside `slot.running()`). What the target's (or the
        slot's) and the draft model's caches hold is kept across engines, so a request that
        shares a prefix with the one before decodes only the rest. `images`: its prompt has
        some (a kind that cannot draft after them gives way to n-gram lookup, saying so)."""
        request = request.seeded()
        if self.target.recurrent:  # an exact request's prompt decodes in one piece, as `run --exact`'s
            (self.target if slot is None else slot).keep_checkpoints(0 if request.exact else self.spec.checkpoints)
        kind = drafts.get(request.draft)
        if images and drafts.after_images(kind) is not kind:
            if self._notice is not None:
                self._notice(f"{kind.name} cannot draft after an image (it reads the target's state by position): "
                             f"drafting with {drafts.after_images(kind).name}")
            kind = drafts.after_images(kind)
        matcher = Matcher(self.vocabulary(), request.constraint) if request.constraint is not None else None
        proposer = self._proposer(request, kind, memory, matcher, slot)
        policy = self._policy(request, kind, proposer, slot)
        drafting = not isinstance(proposer, NoProposer)
        options = EngineOptions(self.spec.verify_on_device and slot is None,
                                self.exact() if request.exact and drafting else None,
                                kind.model_name(self.spec) if drafting else "", reach=self.target.max_rewind)
        target, cache = (self.target, self._cache) if slot is None else (slot, slot.cache)
        return Engine(target, proposer, policy, request, cache=cache, matcher=matcher, options=options)

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

    def unavailable(self, kind: drafts.Kind) -> str | None:
        """Why `kind` cannot draft on this session (None: it can)."""
        reason = kind.why_not(self.loaded.get(kind.name), self.target)
        if reason is None and self.slots and kind.load is not None and kind.name not in self._in_slots:
            return f"{kind.name} drafts in one sequence only, not beside others (--parallel 1)"
        return reason

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

    def _drafters(self) -> dict[str, Callable]:
        """Pricing's drafters by kind: each loaded thing that drafts with a model, as its kind prices it."""
        return {name: drafts.drafter_for(drafts.KINDS[name], thing, self.target, self.spec)
                for name, thing in self.loaded.items() if drafts.KINDS[name].drafter is not None}

    def _max_draft(self, request: GenerationRequest) -> int:
        """The longest draft a step may verify: MAX_DRAFT, held to the largest --exact batch and
        to what a recurrent target's snapshots can take back (a rejected draft and padding rows)."""
        most = self.exact().largest - 1 if request.exact else MAX_DRAFT
        reach = self.target.max_rewind
        return most if reach is None else min(most, reach)

    def _proposer(self, request: GenerationRequest, kind: drafts.Kind, memory: TokenIndex | None,
                  matcher: Matcher | None, slot: Slot | None) -> Proposer:
        if kind.build is None or self.plain_reason(request) is not None:
            return NoProposer()
        reason = self.unavailable(kind)
        if reason is not None:
            raise UsageError(f"draft '{kind.name}': {reason}")
        prediction = self.target.tokenize(request.prediction, add_special=False) if request.prediction else []
        lookup = NGramProposer(references=[memory] if memory is not None else [], prediction=prediction)
        loaded = self._in_slots[kind.name][slot.sequence] if slot is not None and kind.name in self._in_slots \
            else self.loaded.get(kind.name)
        proposer = kind.build(loaded, self.target, request, matcher, lookup)
        # A prediction feeds lookup whatever the draft; without one, --no-ngram is honoured.
        return LookupThenModel(lookup, proposer) if kind.behind_lookup and (request.lookup or prediction) else proposer

    def _policy(self, request: GenerationRequest, kind: drafts.Kind, proposer: Proposer,
                slot: Slot | None) -> DraftPolicy:
        """-k N: N draft tokens a step; -k auto: the adaptive policy, priced with the stored
        costs (with its kind's drafter's, where a model drafts). Never longer than the largest
        --exact batch (the engine caps each step where it is), or a recurrent target's
        snapshots, allow."""
        if isinstance(proposer, NoProposer):
            return FixedDraftPolicy(0)
        max_draft = self._max_draft(request)
        auto = request.draft_tokens == AUTO
        costs = self.pricing.costs(measure=auto, kind=kind.name if kind.drafter is not None else None)
        if self.target.on_gpu:  # padding and changes of shape priced as the policy prices steps
            self._cache.shapes.priced(VerifyCurve(costs.verify), costs.change)
        if auto:
            return AdaptiveDraftPolicy(costs, prior=proposer.prior, max_draft=max_draft,
                                       shapes=self._cache.shapes if slot is None else None, batch=slot)
        return FixedDraftPolicy(min(request.draft_tokens, max_draft))

    def close(self) -> None:
        if self.slots:
            self.slots[0].steps.close()
        if self.projector is not None:
            self.projector.close()
        for thing in reversed(self.loaded.values()):  # the NextN layers before the target they read
            thing.close()
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(spec: SessionSpec, notice: Callable[[str], None] | None = None) -> Session:
    """Load the target and what the draft kinds asked for draft with (specli/drafts.py). With
    spec.exact, first find (or read) the exact verify batches with repacking on and off, and
    load with the setting that allows more drafting (where no batch above one row is exact
    anywhere, nothing that drafts is loaded); `notice` hears of a measurement before it
    starts, and of a draft that drafts through text."""
    exact_cap = None
    if spec.exact:
        spec, exact_cap = _exact_settings(spec, notice)
    wanted = [kind for kind in drafts.KINDS.values() if kind.load is not None and kind.is_wanted(spec)]
    load = next((kind.target_loader for kind in wanted if kind.target_loader is not None), _load_target)
    target = load(spec)
    loaded: dict[str, Any] = {}
    projector = None
    try:
        if exact_cap is None or exact_cap.largest > 1:
            for kind in wanted:
                assert kind.load is not None
                loaded[kind.name] = kind.load(spec, target, notice)
        if spec.projector is not None:
            projector = vision.Projector(spec.projector, target, threads=spec.target_load.threads or os.cpu_count() or 1,
                                         gpu=spec.target_load.gpu_layers != 0 and target.on_gpu, verbose=spec.verbose)
        session = Session(spec, target, loaded, exact_cap=exact_cap, notice=notice, projector=projector)
        _warm_up(target, loaded.values())
        if session.slots:  # read (or measured) now: a calibration decodes sequence 0, which a slot runs in
            costs = session.pricing.costs()
            if costs.source not in ("prior", "conservative"):  # measured: what a shared step pads by
                session.slots[0].steps.curve = VerifyCurve(costs.verify)
            for name in loaded:  # and each drafter's, with the target's
                session.pricing.costs(kind=name if drafts.KINDS[name].drafter is not None else None)
            release_threads()  # (the slots decode on a thread of their own)
    except BaseException:
        if projector is not None:
            projector.close()
        for thing in reversed(loaded.values()):
            thing.close()
        target.close()
        raise
    return session


def _load_target(spec: SessionSpec) -> Model:
    """The target as every kind but those with a loader of their own opens it."""
    return mtp.load_model(spec.target, spec.target_load, verbose=spec.verbose, chat_template=spec.chat_template)


def _warm_up(target: Model, loaded: Iterable[Any]) -> None:
    """On a GPU, decode each verify batch size once, and a token on each model that drafts
    there, before the first timed step: the first use of a size allocates and picks its
    kernels, which a fresh run would otherwise pay for inside its steps. Caches left empty."""
    if target.on_gpu:
        token = target.bos if target.bos >= 0 else 0
        for size in GPU_SIZES:
            if size < min(target.n_ctx, target.batch_size):
                target.decode([token] * size, all_logits=True)
                target.rewind(0)
    for thing in loaded:
        if getattr(thing, "on_gpu", False):  # a draft model there (the NextN layers' rows come to the host)
            thing.forget()
            thing.choice_after([0, 0])
            thing.forget()


def _exact_settings(spec: SessionSpec, notice: Callable[[str], None] | None) -> tuple[SessionSpec, BatchCap]:
    caps = exact_caps(spec, notice)
    # The faster kernels where they allow as many draft tokens along the context.
    repack = caps[True].drafted_positions() >= caps[False].drafted_positions()
    spec = replace(spec, target_load=replace(spec.target_load, repack=repack),
                   draft_load=replace(spec.draft_load, repack=repack))
    return spec, caps[repack]
