"""Verify batch shapes a GPU can reuse: padding to a few sizes, keeping a shape while its
padding costs less than a change, the engine's padded batches, and the steady calibration
that prices a change."""

from __future__ import annotations

import time

import pytest
from fakes import FakeModel, plain_greedy

from specli.decode.costs import VerifyCurve, calibrate
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine, EngineOptions, TargetCache
from specli.decode.exact import BatchCap
from specli.decode.events import Finished, StepRecord, Token
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.decode.shapes import GPU_SIZES, BatchShapes

FLAT = VerifyCurve({1: 1.0, 2: 1.34, 8: 1.40, 16: 1.52, 48: 1.65})  # an H200's 8B curve, in one-token units


def gpu_shapes(change: float) -> BatchShapes:
    shapes = BatchShapes.any()
    shapes.priced(FLAT, change)
    return shapes


def test_any_decodes_exactly_the_rows_needed():
    shapes = BatchShapes.any()
    assert [shapes.rows(n) for n in (1, 4, 7, 49)] == [1, 4, 7, 49]
    assert shapes.cost(FLAT, 4) == pytest.approx(FLAT.cost(4))


def test_rows_are_padded_to_the_smallest_allowed_size_within_the_cap():
    shapes = gpu_shapes(change=0.0)
    assert [shapes.rows(n, 49) for n in (1, 2, 4, 6, 10, 40)] == [1, 2, 5, 9, 17, 49]
    assert shapes.rows(4, most=4) == 4  # no allowed size fits under an --exact cap: exactly the rows
    assert all(shapes.rows(n, 49) in GPU_SIZES for n in range(1, 50))


def test_a_shape_is_kept_while_its_padding_costs_less_than_a_change():
    change = 0.5  # a change: half a one-token decode; padding 9 rows over 3: 0.07
    shapes = gpu_shapes(change)
    shapes.used(9, 9)
    padding = FLAT.cost(9) - FLAT.cost(3)
    kept = 0
    while shapes.rows(3, 49) == 9:
        shapes.used(9, 3)
        kept += 1
    assert kept == int(change // padding)  # rent until the rent paid would exceed the price of buying
    shapes.used(3, 3)
    assert shapes.changed and shapes.padded == 0.0
    # A change is priced where a choice would make one, and paid where one was made.
    assert shapes.cost(FLAT, 3) == pytest.approx(FLAT.cost(3))
    assert shapes.cost(FLAT, 40, 49) == pytest.approx(FLAT.cost(49) + change)
    assert shapes.paid(FLAT, 3) == pytest.approx(FLAT.cost(3) + change)


def run(engine: Engine, prompt: list[int]) -> tuple[list[int], list[StepRecord], Finished]:
    tokens, steps, finished = [], [], None
    for event in engine.generate(prompt):
        if isinstance(event, Token) and event.id >= 0:
            tokens.append(event.id)
        elif isinstance(event, StepRecord):
            steps.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return tokens, steps, finished


@pytest.mark.parametrize("k", [2, 5, 12])
def test_padded_verify_batches_write_plain_decodings_text_and_keep_the_cache_in_step(k):
    prompt = [3, 3, 3, 3, 7, 1, 2, 3, 3, 3, 7, 1, 2, 3]
    target = FakeModel(seed=0)
    draft = DraftModelProposer(DraftModel(FakeModel(seed=0, noise_seed=1, noise=2.0)), SamplingSettings())
    shapes = gpu_shapes(change=10.0)  # every size is kept once used: most batches are padded
    engine = Engine(target, draft, FixedDraftPolicy(k), GenerationRequest(max_tokens=50),
                    cache=TargetCache(shapes=shapes), options=EngineOptions(cap=BatchCap.anywhere(49)))
    tokens, steps, _ = run(engine, prompt)
    assert tokens == plain_greedy(FakeModel(seed=0), prompt, 50)
    assert target.kv == prompt + tokens[:-1]  # padding rows were rewound with the rejected ones
    verify_sizes = target.batch_sizes[1:]  # after the prompt's
    assert set(verify_sizes) <= set(GPU_SIZES)
    assert [step.rows for step in steps] == verify_sizes
    assert any(step.rows > step.drafted + 1 for step in steps)  # some batches were padded


class ChoosesThree(FixedDraftPolicy):
    """Looks up to 48 tokens ahead but verifies 3 (as -k auto may choose)."""

    def choose(self, key, extent, available, support=(), behind=0, agreeing=()) -> int:
        return min(3, available)


def test_a_lookup_proposal_longer_than_its_draft_fills_the_padding_rows():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    target = FakeModel(seed=0)
    shapes = gpu_shapes(change=10.0)
    shapes.used(17, 17)  # the last decode had 17 rows: kept, since a change costs more than padding
    engine = Engine(target, NGramProposer(), ChoosesThree(48), GenerationRequest(max_tokens=12),
                    cache=TargetCache(shapes=shapes), options=EngineOptions(cap=BatchCap.anywhere(49)))
    tokens, steps, _ = run(engine, prompt)
    assert tokens == plain_greedy(FakeModel(seed=0), prompt, 12)
    drafting = [step for step in steps if step.drafted]
    assert drafting and all(step.rows == 17 for step in drafting)
    assert any(step.drafted > 3 for step in drafting)  # the proposal's further tokens were verified too


def test_a_steady_calibration_times_a_replayed_shape_and_prices_a_change():
    graphless, capture, base = 0.02, 0.01, 0.002
    state = {"last": None, "captured": False}

    def decode(tokens: list[int]) -> None:  # ggml-cuda's rule: one graph, captured by the 2nd call
        shape, extra = len(tokens), 0.0
        if shape != state["last"]:
            extra, state["captured"] = graphless, False
        elif not state["captured"]:
            extra, state["captured"] = capture, True
        state["last"] = shape
        time.sleep(base + extra)

    outcome = calibrate(decode, lambda n_keep: None, 0, (1, 2, 4), passes=3, steady=True)
    assert max(outcome.verify.values()) < base + capture  # replays, not the first decodes of a shape
    assert graphless < outcome.shape_change < 3 * (graphless + capture)
    assert calibrate(decode, lambda n_keep: None, 0, (1, 2, 4), passes=3).shape_change is None


def test_stats_count_the_steps_that_changed_the_batch_size():
    from specli.decode.events import Stats

    stats = Stats()
    for rows in (3, 3, 9, 9, 1, 1, 1):
        stats.record(StepRecord(rows - 1, 0, 0.0, 0.0, 0.0, 0.0, rows=rows))
    assert stats.batch_changes == 2 and "last_rows" not in stats.to_dict() and "cuda_graphs" not in stats.to_dict()


def test_the_cuda_backends_graph_lines_are_counted_from_the_silent_log():
    from specli.llama import backend

    before = backend.cuda_graph_events()
    for line in (b"CUDA Graph id 12 reused\n", b"ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n",
                 b"ggml_backend_cuda_graph_compute: CUDA graph warmup reset\n", b"llama_context: n_ctx = 512\n"):
        backend._silent_log(4, line, None)
    after = backend.cuda_graph_events()
    assert {event: after[event] - before[event] for event in after} == {"reused": 1, "captured": 1, "reset": 1}
