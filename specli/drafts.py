"""Every draft kind, declared once: one `Kind` record each (none, ngram, model, mtp, and
auto, which picks one of them at load), read by the session, pricing, serve (its checks,
/v1/models, the page's labels), --draft's parsing and help, and the pairs' `draft = "NAME"`.

A record says:
- its name and help, and the label the page gives the spans it drafted (`provenance` is the
  `proposer` name its proposer puts on them);
- what the session loads for it (`wanted`, then `load`: a loaded thing with `close()`,
  closed with the session; `target_loader`: how the target is opened for it);
- how its proposer is built from that (`build`; None: it never drafts), and whether n-gram
  lookup proposes before it;
- why it cannot draft on a loaded session (`unavailable`), and what a server loads so that a
  request may ask for it (`offered`);
- what it drafts with in each of the target's slots, beside other requests (`in_slots`;
  None: where it loads anything, it drafts in one sequence only);
- its cost path (`cost_key`: where its measurements are stored; `drafter`: the model that
  drafts, as specli/pricing/ times and stores it; None: the target's costs alone price it);
- how --draft auto weighs it (`choose`, tried in AUTO's order), and what of the target's own
  it drafts with (`own`: `specli drafts` lists and measures it beside the draft models);
- whether it drafts after a prompt's images (`after_images`);
- how far `-k auto` drafts on a recurrent or hybrid target (`auto_reach`: the snapshots of
  its state such a target keeps, see `snapshots`).

Adding a kind: its proposer (decode/), what it loads (llama/), its record (`register`, here
or from its own module); nothing else names it. Only `Session.engine_for` calls `build`.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from specli.decode.constraint import Matcher
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.mtp import MtpProposer, NextnDraft, NextnSlot
from specli.decode.ngram import NGramProposer
from specli.decode.policy import MAX_DRAFT
from specli.decode.proposers import Proposer
from specli.decode.request import AUTO as DRAFT_AUTO
from specli.decode.request import DraftKind, DraftTokens, GenerationRequest
from specli.decode.slots import Slot, draft_slots
from specli.decode.translate import TranslatedDraft
from specli.errors import UsageError, VocabMismatchError
from specli.llama import mtp
from specli.llama.backend import LoadSettings, Model
from specli.llama.vocab import check_vocab_compatible
from specli.models import resolve
from specli.models.resolve import ResolvedModels
from specli.pricing.drafters import Drafter, model_drafter, nextn_drafter
from specli.pricing.keys import StoreKey, build_key, cost_store, draft_key, settings_key

Notice = Callable[[str], None] | None
# build(loaded, target, request, matcher, lookup): the kind's proposer for one request
# (`lookup`: the request's n-gram lookup, which the session puts in front where it proposes first).
Build = Callable[[Any, Model, GenerationRequest, "Matcher | None", NGramProposer], Proposer]


@dataclass(frozen=True)
class Kind:
    """One draft kind, as the module docstring lists its parts; `name` is how a request, a
    pair and --draft name it."""

    name: str
    help: str  # "NAME: what drafts", as an unknown kind's error lists the kinds
    build: Build | None = None
    provenance: str = ""  # the `proposer` name on the tokens it drafts
    label: str = ""  # the page's words for it: "drafted by <label>"
    model_name: Callable[[Any], str] = lambda spec: ""  # the model that drafts, as the stats name it
    behind_lookup: bool = False  # n-gram lookup proposes first (--no-ngram: not; a prediction: always)
    wanted: Callable[[Any], bool] | None = None  # from the SessionSpec (None: its name is in spec.loads)
    load: Callable[[Any, Model, Notice], Any] | None = None  # (spec, target, notice): what it drafts with
    target_loader: Callable[[Any], Model] | None = None  # how the target opens (from the SessionSpec) for it
    # Why it cannot draft, from what was loaded for it (None: where it loads anything, that it did).
    unavailable: Callable[[Any, Model], str | None] | None = None
    offered: Callable[[Any], bool] = lambda spec: False  # a server loads it unasked (requests may ask)
    declined: Callable[[Any], str | None] = lambda spec: None  # why a server does not, though the file has it
    # (loaded, the session's slots): what it drafts with in each slot, one per slot, in their
    # order; None where what was loaded drafts in one sequence only.
    in_slots: Callable[[Any, list[Slot]], list[Any] | None] | None = None
    # From the SessionSpec: what it loads would draft in one sequence only (in_slots gives None).
    alone_when: Callable[[Any], bool] = lambda spec: False
    # Where its drafter's measurements are stored, beside the target's key (draft file, its load settings).
    cost_key: Callable[[StoreKey, Path | None, LoadSettings], StoreKey] | None = None
    drafter: Callable[[Any, StoreKey, Model, Any], Drafter] | None = None  # (loaded, its cost_key, target, spec)
    choose: Callable[[Path, Any, Notice], ResolvedModels | None] | None = None  # --draft auto
    # The target's own layers it drafts with, counted from its file where this build can run
    # them (0: none), and the name `specli drafts --json` gives the count.
    own: Callable[[Path], int] | None = None
    own_field: str = "layers"
    order: tuple[str, ...] = field(default=())  # auto only: the kinds it tries, in turn
    # It drafts from a prompt's text around its images (decode/media.py). False: its proposer
    # reads the target's own state by position, so such a prompt drafts with n-gram lookup.
    after_images: bool = True
    # -k auto's longest draft on a recurrent or hybrid target, which keeps that many snapshots
    # of its state a sequence to take a rejected draft back (llama.cpp's n_rs_seq).
    auto_reach: int = 8

    @property
    def drafts(self) -> bool:
        return self.build is not None

    def why_not(self, loaded: Any, target: Model) -> str | None:
        """Why it cannot draft, given what the session loaded for it (None: it can)."""
        if self.unavailable is not None:
            return self.unavailable(loaded, target)
        return "not loaded on this session" if self.load is not None and loaded is None else None

    def alone(self, spec: Any) -> bool:
        """What it loads for `spec` would draft in one sequence only (not beside other requests)."""
        return self.load is not None and (self.in_slots is None or self.alone_when(spec))

    def is_wanted(self, spec: Any) -> bool:
        return self.wanted(spec) if self.wanted is not None else self.name in spec.loads


def _open_draft(spec: Any, target: Model, notice: Notice) -> DraftModel:
    """The draft model, drafting through text where its vocabulary fails llama.cpp's rule."""
    draft = Model(spec.draft_model, spec.draft_load, verbose=spec.verbose)
    try:
        if draft.recurrent:  # its drafting decodes are one token each: no snapshot reaches back a draft
            raise UsageError(f"{spec.draft_model.name} has recurrent layers: this llama.cpp cannot take its "
                             "rejected draft tokens back", "draft with an attention-only model, --draft ngram or mtp")
        check_vocab_compatible(target, draft)
        return DraftModel(draft, on_gpu=draft.on_gpu)
    except VocabMismatchError as refused:
        # Its tokens mean nothing to the target: it drafts through text instead.
        if notice is not None:
            notice(f"{refused.message}: drafting through text (the draft's tokens are re-tokenized for the target)")
        return DraftModel(draft, on_gpu=draft.on_gpu, through_text=True)
    except BaseException:
        draft.close()
        raise


def _nextn_in_slots(draft: NextnDraft, slots: list[Slot]) -> list[NextnDraft] | None:
    """The target's NextN layer beside each slot (its context takes as many sequences): their
    drafting entries go into one MTP decode a draft position across the slots. Chained layers
    (a context each) draft in one sequence only: None."""
    if draft.depth is not None:
        return None
    return [NextnDraft(NextnSlot(draft.heads, slot)) for slot in slots]


def _draft_in_slots(draft: DraftModel, slots: list[Slot]) -> list[DraftModel]:
    """The draft model's sequence beside each slot (it was loaded with as many): their drafting
    decodes go into one draft decode across the slots (decode/slots.py)."""
    return [DraftModel(sequence, through_text=draft.through_text)
            for sequence in draft_slots(slots, draft.model)]


def _model_proposer(draft: DraftModel, target: Model, request: GenerationRequest, matcher: Matcher | None,
                    lookup: NGramProposer) -> Proposer:
    # Through text its tokens are not the target's: the engine checks what it brings instead.
    keyed = not draft.through_text
    model = DraftModelProposer(draft, request.sampling, request.seed or 0, request.draft_min_p, keyed=keyed,
                               constraint=matcher if keyed else None)
    return model if keyed else TranslatedDraft(target, model)  # type: ignore[return-value]


def _model_cost(draft: DraftModel, key: StoreKey, target: Model, spec: Any) -> Drafter:
    return model_drafter(key, target, draft, spec.draft_model, draft.through_text)


def _auto_model(target: Path, speedup: Any, notice: Notice) -> ResolvedModels | None:
    chosen = resolve.auto_draft(target, notice, speedup=speedup)
    return ResolvedModels(target, DraftKind.MODEL, chosen) if chosen is not None else None


def _nextn_layers(target: Path) -> int:
    """The target's NextN layers where this build can draft with them (0: none, or no MTP API)."""
    return mtp.nextn_layers(target) if target.is_file() and mtp.supports_mtp() else 0


def _auto_mtp(target: Path, speedup: Any, notice: Notice) -> ResolvedModels | None:
    """--draft auto on a target with NextN layers this build can run: MTP, unless its measured
    speed-up loses or a draft model's measured one beats it (`speedup(target, None)`: MTP's).
    One line on stderr names the choice; a target without them says nothing here."""
    from specli.models.local import draft_candidates

    say = notice or (lambda line: print(f"specli: {line}", file=sys.stderr))
    if not target.is_file():
        return None
    problem = mtp.nextn_problem(target)
    if problem is not None:
        say(f"--draft auto: the target has NextN (MTP) layers, but {problem}")
        return None
    if mtp.nextn_layers(target) <= 0:
        return None
    reason = mtp.unsupported_reason()
    if reason is not None:
        say(f"--draft auto: the target has NextN (MTP) layers, but {reason}")
        return None
    own = speedup(target, None) if speedup is not None else None
    if own is not None and own <= 1:
        say(f"--draft auto: the target's NextN (MTP) layers were measured to lose ({own:.2f}x)")
        return None
    _, candidates = draft_candidates(target, speedup=speedup)
    gains = [(gain, c.draft.name) for c in candidates
             if (gain := speedup(target, Path(c.draft.path)) if speedup is not None else None) is not None]
    best = max(gains, default=None)
    if best is not None and best[0] > 1 and own is None:  # a measured gain beats an unmeasured one
        say(f"--draft auto: {best[1]} measured {best[0]:.2f}x; the target's NextN (MTP) layers are not measured "
            "(`specli drafts TARGET --measure`)")
        return None
    if own is not None and best is not None and best[0] > own:
        say(f"--draft auto: {best[1]} measured {best[0]:.2f}x, more than the target's NextN (MTP) layers' {own:.2f}x")
        return None
    measured = f", measured {own:.2f}x" if own is not None else ""
    say(f"--draft auto: drafting with the target's own NextN (MTP) layers{measured}")
    return ResolvedModels(target, DraftKind.MTP)


# In the NextN layers' cost key: a change in how they are timed measures them again (2: the
# catch-up decodes no logits row).
MTP_COSTS_VERSION = 2

NONE = Kind(DraftKind.NONE, "none: plain decoding, the target writes every token")
NGRAM = Kind(DraftKind.NGRAM, "ngram: n-gram lookup in the prompt, the answer so far and a prediction",
             build=lambda loaded, target, request, matcher, lookup: lookup,
             provenance="ngram", label="n-gram lookup",
             choose=lambda target, speedup, notice: ResolvedModels(target, DraftKind.NGRAM))
MODEL = Kind(DraftKind.MODEL, "model: the small draft model loaded with --draft FILE", build=_model_proposer,
             provenance="draft", label="the draft model", behind_lookup=True,
             model_name=lambda spec: spec.draft_model.name,
             wanted=lambda spec: spec.draft_model is not None, load=_open_draft,
             unavailable=lambda loaded, target: None if loaded is not None else "no draft model is loaded "
                                                                                "(load one with --draft MODEL)",
             in_slots=_draft_in_slots,
             cost_key=lambda key, draft, load: draft_key(key, draft, load), drafter=_model_cost, choose=_auto_model)
MTP = Kind(DraftKind.MTP, "mtp: the target's own NextN (MTP) layers",
           build=lambda nextn, target, request, matcher, lookup: MtpProposer(
               nextn, request.sampling, request.seed or 0, request.draft_min_p, constraint=matcher),
           provenance="mtp", label="the model's own MTP layers", behind_lookup=True,
           load=lambda spec, target, notice: NextnDraft(mtp.MtpHeads(target, spec.nextn_file)),
           target_loader=lambda spec: mtp.load_target(spec.target, spec.target_load, sidecar=spec.nextn_file,
                                                      verbose=spec.verbose, chat_template=spec.chat_template),
           unavailable=lambda loaded, target: None if loaded is not None else
           f"{target.path.name} has no NextN (MTP) layers open to draft with",
           offered=lambda spec: _nextn_layers(spec.target) > 0,
           declined=lambda spec: mtp.nextn_problem(spec.target) if spec.target.is_file() else None,
           cost_key=lambda key, draft, load: key.beside(f"mtp-v{MTP_COSTS_VERSION}"),
           drafter=lambda nextn, key, target, spec: nextn_drafter(key, target, nextn),
           choose=_auto_mtp, own=_nextn_layers, own_field="nextn_layers", after_images=False,
           in_slots=_nextn_in_slots, alone_when=lambda spec: _nextn_layers(spec.target) > 1,  # chained
           auto_reach=3)  # llama.cpp's --spec-draft-n-max: a head fed its own state agrees less at each depth
AUTO = Kind("auto", "auto: the best draft measured on this machine: the target's MTP layers, a local "
            "draft model of its vocabulary, else n-gram lookup", order=(DraftKind.MTP, DraftKind.MODEL,
                                                                          DraftKind.NGRAM))

KINDS: dict[str, Kind] = {kind.name: kind for kind in (MODEL, MTP, NGRAM, NONE, AUTO)}
# What else drafts a span: a grammar's forced tokens (not a kind a request asks for).
OTHER_LABELS = {"grammar": "the grammar"}


def own_layers(target: Path) -> dict[str, int]:
    """The kinds that draft with the target's own layers, and how many it has for each."""
    counts = {name: kind.own(target) for name, kind in KINDS.items() if kind.own is not None}
    return {name: count for name, count in counts.items() if count > 0}


def register(kind: Kind) -> Kind:
    """Declare a draft kind (or replace one of the same name)."""
    KINDS[kind.name] = kind
    return kind


def after_images(kind: Kind) -> Kind:
    """The kind that drafts for a prompt with images where `kind` is asked for: itself, or
    n-gram lookup where it cannot draft after them."""
    return kind if kind.after_images or not kind.drafts else NGRAM


def get(name: str) -> Kind:
    """The kind a generation drafts with (not auto, which is chosen at load). UsageError
    naming the kinds where there is none."""
    kind = KINDS.get(name)
    if kind is None or kind.order:
        kinds = "; ".join(KINDS[other].help for other in runnable())
        raise UsageError(f"draft {name!r}: no such draft kind", f"one of {kinds}")
    return kind


def runnable() -> list[str]:
    """The kinds a generation may draft with, those that draft most first, plain decoding last."""
    return sorted((name for name, kind in KINDS.items() if not kind.order), key=lambda name: not KINDS[name].drafts)


def words() -> str:
    """--draft's words besides a model file, for its help."""
    return ", ".join(name for name, kind in KINDS.items() if kind.name != DraftKind.MODEL)


def labels() -> dict[str, str]:
    """Who drafted a span, by the `proposer` name on it: what the page shows."""
    return {kind.provenance: kind.label for kind in KINDS.values() if kind.provenance} | OTHER_LABELS


def offered(own: str, unavailable: Callable[[Kind], str | None]) -> list[str]:
    """The `draft` values a request may give on a loaded session (`unavailable`: the
    session's), the server's own first."""
    return [name for name in [own] + [other for other in runnable() if other != own]
            if name in KINDS and unavailable(KINDS[name]) is None]


def for_server(spec: Any, notice: Notice = None) -> Any:
    """The SessionSpec with what a server loads so that requests may ask for it (the target's
    NextN layers wherever they can draft); `notice` hears why a kind the file has is not."""
    extra = tuple(name for name, kind in KINDS.items() if name not in spec.loads and kind.offered(spec))
    for name, kind in KINDS.items():
        reason = kind.declined(spec) if name not in spec.loads + extra else None
        if reason is not None and notice is not None:
            notice(f"requests cannot draft with '{name}': {reason}")
    load = replace(spec.target_load, recurrent_snapshots=max(spec.target_load.recurrent_snapshots,
                                                              snapshots(extra, [DRAFT_AUTO])))
    return replace(spec, loads=spec.loads + extra, target_load=load)


def snapshots(loads: Iterable[str], draft_tokens: Iterable[DraftTokens]) -> int:
    """The snapshots of its recurrent state a recurrent or hybrid target keeps a sequence
    (llama.cpp's n_rs_seq), sized to what the run drafts with the kinds it `loads` and its
    `-k` values: none where nothing drafts (as llama.cpp decodes plainly), a fixed N's N, and
    -k auto's `auto_reach`. The longest draft a step verifies there is as long (a longer one
    could not be taken back). The snapshots change no logits (tests/test_recurrent_memory.py)."""
    kinds = [KINDS[name] for name in loads if name in KINDS and KINDS[name].drafts]
    return max((kind.auto_reach if tokens == DRAFT_AUTO else min(int(tokens), MAX_DRAFT)
                for kind in kinds for tokens in draft_tokens), default=0)


def drafter_for(kind: Kind, loaded: Any, target: Model, spec: Any) -> Callable[[StoreKey], Drafter]:
    """Pricing's drafter for a loaded kind: made with the target's key, read anew each time."""
    assert kind.drafter is not None and kind.cost_key is not None
    drafter, cost_key = kind.drafter, kind.cost_key
    return lambda key: drafter(loaded, cost_key(key, spec.draft_model, spec.draft_load), target, spec)


def stored_speedup(target: Path, draft: Path | None, load: LoadSettings, kind: str | None = None) -> float | None:
    """The speed-up `specli drafts --measure` timed and stored for the draft model `draft`, or
    for `kind`'s own layers (draft None; MTP's where no kind is named), loaded with `load`
    (None: not measured)."""
    kind = MODEL if draft is not None else KINDS[kind or DraftKind.MTP]
    assert kind.cost_key is not None
    try:
        key = kind.cost_key(settings_key(target, load, build_key()), draft, load).beside("speedup")
    except OSError:
        return None
    value = cost_store().get(key)
    return float(value) if isinstance(value, (int, float)) else None


def resolve_models(pair: str | None, target: str | Path | None, draft: str | None,
                   speedup: Callable[[Path, Path | None], float | None] | None = None) -> ResolvedModels:
    """-m, --target and --draft: the files to load and the draft kind. --draft NAME names a
    kind; auto tries AUTO's kinds in turn; anything else is a model (resolve.resolve_models)."""
    check_spelling(draft)
    if pair is not None and target is None and draft is None:
        _check_pair(pair)  # before anything is downloaded
    if draft is None or draft not in KINDS:
        models = resolve.resolve_models(pair, target, draft)
        if models.draft_model is not None and mtp.is_sidecar(models.draft_model):  # as llama.cpp's -md names one
            return replace(models, draft=DraftKind.MTP, draft_model=None, nextn_file=models.draft_model)
        return models
    models = resolve.resolve_models(pair, target, None)
    kind = KINDS[draft]
    if kind.order:
        for name in kind.order:
            chosen = KINDS[name].choose(models.target, speedup, None) if KINDS[name].choose else None
            if chosen is not None:
                return replace(chosen, draft_tokens=models.draft_tokens)
    if kind is MODEL:  # the word alone: the pair's draft model, where it has one
        if models.draft_model is None:
            raise UsageError("--draft model: no draft model to load", "name its file: --draft FILE")
        return models
    return replace(models, draft=kind.name, draft_model=None)


def _check_pair(pair: str) -> None:
    """A pair's `draft = "NAME"` names a kind a generation can draft with (not auto, and not
    "model": a draft model is a table)."""
    from specli.models.registry import load_registry

    entry = load_registry().get(pair)
    if isinstance(entry.draft, str):
        try:
            if get(entry.draft) is MODEL:
                raise UsageError("a draft model is given as a table (repo and file, path or package)")
        except UsageError as error:
            raise UsageError(f"pair {pair}: {error.message}", error.hint) from None


def check_spelling(draft: str | None) -> None:
    """--draft ngrm: a misspelt kind, not a missing file."""
    if draft is None or draft in KINDS or Path(draft).exists() or any(mark in draft for mark in "/.:"):
        return
    close = difflib.get_close_matches(draft, list(KINDS), n=1, cutoff=0.6)
    if close:
        raise UsageError(f"--draft {draft}: no such file or draft kind", f"did you mean --draft {close[0]}?")
