from specli.proposers import NGramProposer, _common_prefix_length


def test_ngram_proposes_what_followed_the_latest_longest_match():
    proposer = NGramProposer(lengths=(3, 2, 1))
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4]
    proposer.prepare(tokens[:3])
    assert proposer.propose(tokens, 2).tokens == [7, 8]  # latest occurrence of 2 3 4
    assert proposer.last_match_length == 3


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
