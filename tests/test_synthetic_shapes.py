"""tests/support/synthetic.py: the 8B shape, and writing with several threads."""

from __future__ import annotations

import pytest

from tests.support.synthetic import LLAMA_8B, SHAPES, Shape, load_vocabulary, write_model


def test_the_8b_shape_has_llama_3_8b_parameter_count_with_its_vocabulary():
    # Llama 3 8B: 8.03B parameters with a 128,256-token vocabulary.
    target = Shape(LLAMA_8B.target_layers, LLAMA_8B.n_embd, LLAMA_8B.n_head, LLAMA_8B.n_head_kv, LLAMA_8B.n_ff, 128256)
    assert target.n_params() == pytest.approx(8.03e9, rel=0.001)
    draft = Shape(LLAMA_8B.draft_layers, LLAMA_8B.n_embd, LLAMA_8B.n_head, LLAMA_8B.n_head_kv, LLAMA_8B.n_ff, 128256)
    assert 1.4e9 < draft.n_params() < 1.6e9
    assert SHAPES["8b"] is LLAMA_8B


@pytest.mark.slow  # writes model files twice
def test_threads_write_the_same_file(tmp_path):
    vocab = load_vocabulary()
    shape = dict(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, vocab=vocab, seed=7, dtype="f16",
                 layer_scale=[1.0, 0.1, 0.1])
    one = write_model(tmp_path / "one.gguf", **shape)
    many = write_model(tmp_path / "many.gguf", workers=3, **shape)
    assert one.read_bytes() == many.read_bytes()
