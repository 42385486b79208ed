"""Greedy verification with the argmax taken on llama.cpp's device (backend sampling,
`Engine(options=EngineOptions(verify_on_device=True))`) writes the tokens the host path writes.

- The engine, on fakes: the device path is taken only where it is exact (greedy, no
  repetition penalty), and writes what the host path writes.
- The backend, on real models and llama.cpp's CPU backend: the same tokens with and without
  device verification (plain, n-gram at fixed K, --exact), on Gemma 3 (262k vocabulary)
  and SmolLM2 (49k).
- Ties: ggml's CPU argmax takes the last of equal maxima, numpy's the first. A synthetic
  model whose output head repeats every row in pairs makes every row a tie; one whose
  output head is zero makes every token tie (the fallback that decodes again on the host).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import FakeModel, plain_greedy
from helpers import generated

from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine, EngineOptions
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import NoProposer
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings, verify_greedy_tokens
from specli.llama.backend import DEVICE_CANDIDATES, LoadSettings, Model

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


# --- the engine, on fakes -----------------------------------------------------------


class RecordingTokens(list):
    def __init__(self, tokens) -> None:
        super().__init__(tokens)
        self.read: list[int] = []

    def __getitem__(self, i):
        self.read.append(i)
        return super().__getitem__(i)


def test_verify_greedy_tokens_keeps_the_agreeing_prefix_and_reads_no_further():
    choices = RecordingTokens([4, 2, 0, 0])
    assert verify_greedy_tokens([4, 5, 6], choices) == (1, 2)
    assert choices.read == [0, 1]
    assert verify_greedy_tokens([4, 5], [4, 5, 7]) == (2, 7)  # bonus token
    assert verify_greedy_tokens([], [3]) == (0, 3)


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
@pytest.mark.parametrize("k", [1, 4])
def test_device_verification_writes_the_host_paths_tokens(proposer, k):
    outputs = []
    for on_device in (False, True):
        target = FakeModel(seed=3, order=1)
        drafting = NGramProposer() if proposer == "ngram" else DraftModelProposer(
            DraftModel(FakeModel(seed=3, order=1, noise_seed=1, noise=2.0)), SamplingSettings(), 0)
        engine = Engine(target, drafting, FixedDraftPolicy(k), GenerationRequest(60), options=EngineOptions(verify_on_device=on_device))
        tokens, stats = generated(engine, PROMPT)
        assert stats.drafted > stats.accepted > 0
        # Every target decode, the prompt's included, goes the one way.
        assert target.argmax_decodes == (stats.steps + 1 if on_device else 0)
        outputs.append(tokens)
    assert outputs[0] == outputs[1] == plain_greedy(FakeModel(seed=3, order=1), PROMPT, 60)


@pytest.mark.parametrize("sampling", [SamplingSettings(repeat_penalty=1.3), SamplingSettings.for_temperature(0.8)])
def test_penalised_and_sampled_runs_keep_the_host_path(sampling):
    """A penalised row needs the draft tokens before it, and a sampled one the whole row."""
    target = FakeModel(seed=3, order=1)
    request = GenerationRequest(40, sampling, seed=5)
    tokens, stats = generated(Engine(target, NGramProposer(), FixedDraftPolicy(4), request, options=EngineOptions(verify_on_device=True)), PROMPT)
    assert target.argmax_decodes == 0 and stats.steps > 0
    host = Engine(FakeModel(seed=3, order=1), NGramProposer(), FixedDraftPolicy(4), request)
    assert tokens == generated(host, PROMPT)[0]


def test_the_bench_option_reaches_the_session_spec():
    from specli.commands import options
    from specli.models.resolve import ResolvedModels

    models = ResolvedModels(Path("target.gguf"))
    spec = options.session_spec(models, {"verify_on_device": True})
    assert spec.verify_on_device and not options.session_spec(models, {}).verify_on_device


@pytest.mark.slow
@pytest.mark.parametrize("penalty, on_device", [("1.0", True), ("1.1", False)])
def test_bench_verifies_on_the_device_when_asked(gemma_path, tmp_path, penalty, on_device):
    import json

    from typer.testing import CliRunner

    from specli.commands.cli import app

    workloads = tmp_path / "workloads.toml"
    workloads.write_text('[[workload]]\nname = "copy"\nmax_tokens = 16\nprompt = "red, green, blue, red, green, blue, red,"\n')
    result = CliRunner().invoke(app, ["bench", "--target", str(gemma_path), "--prompts", str(workloads), "-k", "4",
                                      "--runs", "1", "--repeat-penalty", penalty, "--verify-on-device", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["verify_on_device"] is on_device
    assert set(report["workloads"][0]["configs"]) == {"plain", "k=4"}


# --- the backend, on real models ------------------------------------------------------

PROMPTS = [
    "Copy this list exactly: red, green, blue, cyan, magenta, yellow. Copy: red, green,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The history of the printing press begins",
]
MAX_TOKENS = 40


def generate(target, proposer, k: int, on_device: bool, prompt: str):
    engine = Engine(target, proposer, FixedDraftPolicy(k), GenerationRequest(MAX_TOKENS), options=EngineOptions(verify_on_device=on_device))
    return generated(engine, target.tokenize(prompt))


@pytest.fixture(scope="module", params=["gemma", "smollm"])
def real_target(request):
    return request.getfixturevalue(f"{request.param}_model")


@pytest.mark.slow
@pytest.mark.parametrize("kind, k", [("none", 0), ("ngram", 4), ("ngram", 12)])
def test_real_models_write_the_same_tokens_with_and_without_device_verification(real_target, kind, k):
    rejected = 0
    for prompt in PROMPTS[:2]:
        runs = [generate(real_target, NoProposer() if kind == "none" else NGramProposer(), k, on_device, prompt=prompt)
                for on_device in (False, True)]
        (host, host_stats), (device, device_stats) = runs
        assert device == host, prompt
        assert (device_stats.steps, device_stats.drafted, device_stats.accepted) == (
            host_stats.steps, host_stats.drafted, host_stats.accepted)
        rejected += device_stats.drafted - device_stats.accepted
    assert kind == "none" or rejected > 0, "rejections: rows after them left unread, the cache rewound"


@pytest.mark.slow
def test_decode_argmax_is_the_argmax_of_decode_for_every_row(real_target):
    model = real_target
    tokens = model.tokenize(PROMPTS[2] + " in the fifteenth century, when a goldsmith of Mainz")
    model.rewind(0)
    model.decode(tokens[:8])
    host = [int(np.argmax(row)) for row in model.decode(tokens[8:], all_logits=True)]
    model.rewind(8)
    choices = model.decode_argmax(tokens[8:], all_rows=True)
    assert len(choices) == len(host) and list(choices) == host and choices[-1] == host[-1]
    assert model.n_past == len(tokens)
    model.rewind(0)
    last = int(model.decode_argmax(tokens)[0])  # the prompt's decode: its last row only
    model.rewind(0)
    assert last == int(np.argmax(model.decode(tokens)[0]))


@pytest.mark.slow
def test_device_choices_are_refused_after_a_later_decode(gemma_path):
    with Model(gemma_path, LoadSettings(ctx_size=256)) as model:
        tokens = model.tokenize(PROMPTS[1])
        choices = model.decode_argmax(tokens)
        model.decode_argmax([tokens[-1]])
        with pytest.raises(RuntimeError, match="later decode"):
            choices[0]


@pytest.mark.slow
def test_exact_device_verification_writes_plain_decodings_text(gemma_exact_session):
    """--exact: plain decoding on the host path, and speculative runs verified on the device
    at every K the exact batch allows, write one text (a prompt with near-ties)."""
    from specli.comparison import load_workloads
    from specli.prompt import prompt_tokens

    session = gemma_exact_session
    workload = next(w for w in load_workloads() if w.name == "story")
    tokens = prompt_tokens(session.target, workload.prompt, chat=workload.chat)

    def run(proposer, k, on_device):
        engine = Engine(session.target, proposer, FixedDraftPolicy(k), GenerationRequest(40), options=EngineOptions(verify_on_device=on_device))
        return generated(engine, tokens)[0]

    plain = run(NoProposer(), 0, False)
    assert run(NoProposer(), 0, True) == plain
    for k in range(1, session.exact().largest):
        assert run(NGramProposer(), k, True) == plain, k


# --- ties, on synthetic models ----------------------------------------------------------


def _tied_model(tmp_path, name: str, tie) -> Model:
    """A one-layer synthetic llama (SmolLM2's vocabulary) whose output head `tie` rewrites
    in place (an F32 matrix, one row per token)."""
    import gguf

    from tests.support.synthetic import write_model

    path = write_model(tmp_path / f"{name}.gguf", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                       context_length=256)
    reader = gguf.GGUFReader(path, "r+")
    head = next(t for t in reader.tensors if t.name == "output.weight").data
    tie(head)
    head.flush()
    del reader
    return Model(path, LoadSettings(ctx_size=256))


def _count_fallbacks(model: Model) -> list[int]:
    """A list that grows by one each time the model decodes a batch again on the host."""
    calls: list[int] = []
    again = model._argmax_on_host

    def counted():
        calls.append(1)
        return again()

    model._argmax_on_host = counted
    return calls


def _ggml_greedy(model: Model, tokens: list[int]) -> list[int]:
    """Each row's token from llama.cpp's own greedy backend sampler (ggml_argmax)."""
    import llama_cpp

    model._sample_on_device(False)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    try:
        assert llama_cpp.llama_set_sampler(model._ctx, 0, chain)
        model.rewind(0)
        model._decode(tokens, True)
        return [llama_cpp.llama_get_sampled_token_ith(model._ctx, i) for i in range(len(tokens))]
    finally:
        llama_cpp.llama_set_sampler(model._ctx, 0, None)
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.slow
def test_ties_break_as_numpys_argmax_does(tmp_path):
    """Rows 2j and 2j+1 of the output head are equal, so every row's maximum is shared by a
    pair of tokens: the device's candidates hold both, and the lower id is written."""

    def pairs(head):
        head[1::2] = head[0::2]

    with _tied_model(tmp_path, "pairs", pairs) as model:
        tokens = model.tokenize("The quick brown fox jumps over the lazy dog again and again")
        rows = np.array(model.decode(tokens, all_logits=True))
        best = rows.max(axis=1)
        host = rows.argmax(axis=1)
        assert (host % 2 == 0).all() and (rows[np.arange(len(rows)), host + 1] == best).all(), "every row ties"
        model.rewind(0)
        fallbacks = _count_fallbacks(model)
        choices = model.decode_argmax(tokens, all_rows=True)
        assert list(choices) == host.tolist()
        assert fallbacks == [], "settled by the device's candidates, not by a host decode"
        # ggml's own greedy sampler, on the same rows, writes the other token of each pair.
        assert _ggml_greedy(model, tokens) == (host + 1).tolist()


@pytest.mark.slow
def test_a_tie_wider_than_the_candidates_is_read_again_on_the_host(tmp_path):
    """Rows of the output head repeat in groups of 2 x DEVICE_CANDIDATES: every row's maximum
    is shared by more tokens than the device keeps, so the batch is decoded again on the
    host path and numpy's argmax (the group's first id) is written; the KV cache ends where
    the one decode would have left it."""
    group = 2 * DEVICE_CANDIDATES

    def groups(head):
        head[:] = np.repeat(head[::group], group, axis=0)[: len(head)]

    with _tied_model(tmp_path, "groups", groups) as model:
        tokens = model.tokenize("Once upon a time, in a village by the sea")
        rows = np.array(model.decode(tokens, all_logits=True))
        host = rows.argmax(axis=1)
        assert (host % group == 0).all() and (rows[np.arange(len(rows)), host + group - 1] == rows.max(axis=1)).all()
        model.rewind(2)
        fallbacks = _count_fallbacks(model)
        choices = model.decode_argmax(tokens[2:], all_rows=True)
        assert list(choices) == host[2:].tolist()
        assert fallbacks == [1] and model.n_past == len(tokens)
        outputs = []
        for on_device in (False, True):
            engine = Engine(model, NGramProposer(), FixedDraftPolicy(4), GenerationRequest(24), options=EngineOptions(verify_on_device=on_device))
            outputs.append(generated(engine, tokens)[0])
        assert len(outputs[0]) == 24 and outputs[0] == outputs[1]
