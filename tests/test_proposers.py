import pytest

from specli.decode.ngram import EXTENT_LIMIT, MAX_OCCURRENCES, RECENCY, NGramProposer
from specli.decode.text import common_prefix_length as _common_prefix_length


def test_ngram_proposes_what_followed_the_latest_longest_match():
    proposer = NGramProposer(lengths=(3, 2, 1))
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4]
    proposer.prepare(tokens[:3])
    proposal = proposer.propose(tokens, 2)
    assert proposal.tokens == [7, 8] and proposal.key == 3  # latest occurrence of 2 3 4


def test_ngram_reports_how_far_back_the_match_goes():
    proposer = NGramProposer(lengths=(3, 2, 1))
    passage = list(range(10, 50))
    tokens = passage + [1] + passage[:30]  # the copy so far matches 30 tokens, keyed by 3
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 4)
    assert proposal.tokens == passage[30:34] and proposal.key == 3 and proposal.extent == 30
    tokens = [5, 3, 2, 3, 9, 5, 3, 2, 3]  # the longest n, 3, matches 4 tokens: a copy in progress
    proposer.prepare(tokens)
    assert proposer.propose(tokens, 1).extent == 4 and proposer.last_match_extent == 4
    tokens = [7, 1, 2, 3, 9, 7, 2, 3]  # 2 3 only, shorter than the longest n: not a copy
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 1)
    assert proposal.key == 2 and proposal.extent == 0 and proposer.last_match_extent == 2


def test_ngram_match_extent_stops_at_its_limit():
    proposer = NGramProposer()
    passage = [t % 251 for t in range(3 * EXTENT_LIMIT)]
    tokens = passage + [999] + passage[: 2 * EXTENT_LIMIT]
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 1)
    assert proposal.key == 12 and proposal.extent == EXTENT_LIMIT


def test_ngram_prior_grows_with_the_match_and_a_drafted_token_extends_it():
    prior = NGramProposer.prior
    assert prior(1) < prior(2) < prior(4) < prior(8) < prior(12) < prior(12, 24) < prior(12, 200) < 1.0
    assert prior(2, 9) == prior(8, 9)  # what counts is how long the context is, not the key
    assert 0.4 < prior(1) < 0.5 and 0.94 < prior(12) < 0.96 and prior(12, 200) > 0.99


def test_ngram_continues_a_repetition_periodically():
    proposer = NGramProposer(lengths=(2, 1))
    tokens = [5, 6, 7, 5, 6, 7, 5, 6]
    proposer.prepare(tokens)
    assert proposer.propose(tokens, 7).tokens == [7, 5, 6, 7, 5, 6, 7]


def test_ngram_without_match_proposes_nothing():
    proposer = NGramProposer(lengths=(3, 2))
    tokens = [1, 2, 3, 4]
    proposer.prepare(tokens)
    assert proposer.propose(tokens, 4).tokens == []


def test_ngram_index_grows_incrementally():
    proposer = NGramProposer(lengths=(2, 1))
    proposer.prepare([1, 2, 3])
    assert proposer.propose([1, 2, 3, 1, 2], 1).tokens == [3]


def test_common_prefix_length():
    assert _common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert _common_prefix_length([1, 2, 9, 4], [1, 2, 3, 4]) == 2
    assert _common_prefix_length([], [1]) == 0
    assert _common_prefix_length([7], [1]) == 0


def test_a_reference_proposes_where_the_text_has_no_match():
    from specli.decode.ngram import TokenIndex

    prediction = TokenIndex([1, 2, 3, 4, 5, 6, 7, 8])
    proposer = NGramProposer(lengths=(3, 2, 1), references=[prediction])
    tokens = [9, 9, 2, 3]  # "2 3" occurs only in the prediction
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 4)
    assert proposal.tokens == [4, 5, 6, 7] and proposal.key == 2
    assert proposer.last_match_extent == 2


def test_the_committed_text_outweighs_a_reference_whose_match_goes_as_far_back():
    from specli.decode.ngram import TokenIndex

    proposer = NGramProposer(lengths=(2, 1), references=[TokenIndex([5, 6, 1, 1])])
    tokens = [5, 6, 7, 0, 5, 6]
    proposer.prepare(tokens)
    assert proposer.propose(tokens, 2).tokens == [7, 0]


def test_a_reference_whose_match_goes_further_back_wins_over_the_committed_text():
    """An edit: the prompt holds the original (name 50), the prediction the edited code (name
    60). Past the edited name, the prediction's match reaches back over it and the prompt's
    stops there: the prediction drafts, and where the two differ later, its text is drafted."""
    from specli.decode.ngram import TokenIndex

    original, edited = [1, 50, 2, 3, 4, 50, 5], [1, 60, 2, 3, 4, 60, 5]
    proposer = NGramProposer(lengths=(2, 1), references=[TokenIndex(edited)])
    tokens = [9, *original, 8, 1, 60, 2, 3]  # the prompt, then the answer so far
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 3)
    assert proposal.tokens == [4, 60, 5] and proposer.last_match_extent == 4


def test_a_reference_continuation_stops_where_its_text_ends():
    from specli.decode.ngram import TokenIndex

    memory = TokenIndex([1, 2, 3], lengths=(2, 1))
    memory.append([4, 1, 2, 8, 9])
    assert memory.continuation(memory.find_all((1, 2))[-1], 5) == [8, 9], "the latest occurrence"
    assert memory.find_all((3, 4)) == [], "no n-gram spans two texts"
    assert memory.continuation(1, 5) == [2, 3], "the separator ends a continuation"


def test_occurrences_vote_and_a_split_vote_lowers_support():
    """Records with one layout and different values: the three earlier records agree on the
    layout, so the draft follows it; at the value they split, and the token with the most
    (recency-weighted) votes is drafted with its share as support."""
    name, colon, comma, newline = 100, 101, 102, 103
    # Every record's name follows "<value> , newline" (the first one's, a header's ","), so
    # each occurrence matches back as far as the others: all three vote.
    records = [[newline, name, colon, value, comma] for value in (8, 8, 7)]
    tokens = [comma] + [token for record in records for token in record] + [newline, name]
    proposer = NGramProposer(lengths=(1,))
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 4)
    assert proposal.key == 1
    assert proposal.tokens == [colon, 8, comma, newline], "8: two older votes (0.8 + 0.64) against the latest's 7 (1)"
    assert proposal.support[0] == 1.0, "every record has the colon after the name"
    assert proposal.support[1] == pytest.approx((RECENCY**1 + RECENCY**2) / (1 + RECENCY + RECENCY**2))
    assert proposal.support[2:] == (1.0, 1.0), "after the value, those that agreed on it are unanimous"
    assert proposal.agreeing == (3, 2, 2, 2), "all three took the colon, the two older ones the 8"


def test_only_the_occurrences_that_match_furthest_back_vote():
    """A copy in progress: the occurrence being copied matches far further back than older
    look-alikes, so it alone proposes (a suffix tree's deepest node), however many they are."""
    copied = [1, 2, 3, 9, 4, 5]
    tokens = [7, 3, 8] * 4 + copied + [0] + copied[:3]
    proposer = NGramProposer(lengths=(1,))
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 3)
    assert proposal.tokens == [9, 4, 5] and proposal.support == ()
    assert proposer.last_match_extent == 3


def test_a_latest_occurrence_outweighs_one_older_one():
    tokens = [5, 1, 5, 2, 5]
    proposer = NGramProposer(lengths=(1,))
    proposer.prepare(tokens)
    proposal = proposer.propose(tokens, 1)
    assert proposal.tokens == [2] and proposal.support == (1 / (1 + RECENCY),)


def test_only_the_latest_occurrences_vote():
    tokens = [5, 1] * (MAX_OCCURRENCES + 3) + [5, 2] * MAX_OCCURRENCES + [5]
    proposer = NGramProposer(lengths=(1,))
    proposer.prepare(tokens)
    assert proposer.propose(tokens, 1).tokens == [2], "the older 5 1 pairs fell out of the index"


# --- a Predicted Output: the client's claim about the answer ---------------------------------


def test_a_prediction_backs_its_proposals_with_a_key_of_its_own():
    from specli.decode.ngram import PREDICTED, PREDICTION_MATCH

    prompt = [9, 8, 7]
    answer = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    proposer = NGramProposer(lengths=(3, 2, 1), prediction=answer)
    proposer.prepare(prompt)
    # After the prompt and the answer's first tokens, the prediction continues it.
    tokens = prompt + answer[:PREDICTION_MATCH]
    proposal = proposer.propose(tokens, 5)
    assert proposal.tokens == answer[PREDICTION_MATCH : PREDICTION_MATCH + 5] and proposal.key is PREDICTED
    assert proposal.extent >= PREDICTION_MATCH
    # Once the answer has left the prediction, a match in it shorter than PREDICTION_MATCH is
    # a coincidence: it drafts nothing; the committed text's own matches still draft.
    def proposal(tokens: list[int]):
        proposer = NGramProposer(lengths=(3, 2, 1), prediction=[50, 5, 6, 7, 8, 9])
        proposer.prepare([1, 2])
        return proposer.propose(tokens, 3)

    assert proposal([1, 2, 40, 5]).tokens == []
    assert proposal([1, 2, 40, 5, 6]).tokens == []
    assert proposal([1, 2, 40, 3, 40]).tokens[:2] == [3, 40], "the committed text still drafts"
    again = proposal([1, 2, 40, 5, 6, 7])  # back on the prediction: 3 tokens match
    assert again.tokens == [8, 9] and again.key is PREDICTED and again.extent >= PREDICTION_MATCH


def test_a_predictions_prior_starts_high_and_lookups_does_not():
    from specli.decode.ngram import PREDICTED

    assert NGramProposer.prior(PREDICTED, 1) > 0.95 > NGramProposer.prior(1, 1)
    assert NGramProposer.prior(PREDICTED, 40) > NGramProposer.prior(12, 40) > 0.99


def test_a_prediction_drafts_long_from_its_first_token_and_turns_cautious_where_the_answer_departs():
    """On a CPU curve where a 48-token draft rejected outright costs 17 plain steps, lookup's
    first draft is held to the risk budget's few tokens; a prediction's may be as long as
    max_draft. Once the answer departs from it, its next draft is shorter."""
    from dataclasses import replace

    from specli.decode.adaptive import AdaptiveDraftPolicy
    from specli.decode.costs import StepCosts
    from specli.decode.events import StepRecord
    from specli.decode.ngram import PREDICTED

    measured = {1: 0.0135, 2: 0.0253, 3: 0.0433, 4: 0.0333, 5: 0.0517, 8: 0.0451, 9: 0.0648, 16: 0.0813, 17: 0.1036,
                32: 0.165, 33: 0.2, 48: 0.22, 49: 0.235}
    costs = StepCosts(measured, 0.0, 0.0003, "calibrated")
    lookup = AdaptiveDraftPolicy(costs, NGramProposer.prior, max_draft=48)
    predicted = AdaptiveDraftPolicy(costs, NGramProposer.prior, max_draft=48)
    assert lookup.choose(12, 20, 48) < 8
    first = predicted.choose(PREDICTED, 20, 48)
    assert first >= 16
    predicted.record(replace(StepRecord(first, 0, 0.0, measured[49], 0.0, 0.0), key=PREDICTED, extent=20))
    assert predicted.choose(PREDICTED, 3, 48) < first
