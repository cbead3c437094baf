"""The static embedder's token ids: a text is split into its words, whose ids are remembered,
and must give exactly what the tokenizer gives the whole text (else the vectors written before
and after would disagree). Plain-ASCII words are split here; a chunk between spaces with any
other character goes to the tokenizer by itself."""

# ruff: noqa: RUF001 (the texts are about the characters that look like ASCII ones)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions.recall_embedding import StaticEmbedder, installed_embedder, model_files

pytestmark = pytest.mark.skipif(model_files() is None, reason="the recall model is not installed")

LOCOMO = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench-data" / "locomo"
TEXTS = [
    "Hey Mel! How did the pottery class go?",
    "Don't e-mail me@example.com at 10:30pm!! ~_~ `code` {a|b} [1,2] #tag $5.00 50% ^x^ \\o/",
    "tabs\tnew\nlines\r\nand  double  spaces",
    "UPPER lower MiXeD 123abc abc123 1,000,000.5 3.14159 v2.0.1",
    "https://example.com/path?query=1&other=two#anchor",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "a" * 150,  # longer than WordPiece's longest word: one unknown token
    "",
    "   ",
    "café naïve Zürich — “quoted” 東京 😀",  # not plain ASCII: those chunks, the tokenizer's
    "bell\x07and\x00nul",  # control characters: the tokenizer removes them, joining the words
    "I’m here — it’s “fine”, don’t worry 👍\n\tNext line: naïve café",
    "東京タワーに行きました。とても楽しかった！ and then Zürich",
    "no\u00a0break\u3000ideographic\u2028line\x0bvertical\x0cform\x85next",
    "\u0301leading combining mark e\u0301 and stacked a\u0300\u0323",
    "mixed «quotes» and ‹angles› (paren’s) [brackets] {braces}",
    "mot très long " + "é" * 150 + " puis fin",
]


def embedder() -> StaticEmbedder:
    loaded = installed_embedder()
    assert loaded is not None
    return loaded


def tokenizer_ids(model: StaticEmbedder, text: str) -> list[int]:
    ids: list[int] = model._tokenizer.encode(text, add_special_tokens=False).ids
    return ids


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_has_the_ids_the_tokenizer_gives_it(text: str) -> None:
    model = embedder()
    assert model.token_ids(text) == tokenizer_ids(model, text)
    assert model.token_ids(text) == tokenizer_ids(model, text)  # its words now remembered


# Characters where the tokenizer's rules differ: the whitespace it splits on and the
# whitespace only Unicode calls so, accents and combining marks, punctuation inside and outside
# ASCII, ideographs it pads with spaces, control and format characters it removes, emoji.
TRICKY = (
    " \t\n\r\u00a0\u3000\u2028\x0b\x85"  # whitespace
    "aZ9.,!'’“«—-_\u0301\u0323éİßﬁ"  # letters, punctuation, marks, ligatures
    "東京タ한😀\x00\x07\u200b\ufeff"  # ideographs, emoji, control and format characters
)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=TRICKY, max_size=40))
def test_any_text_has_the_ids_the_tokenizer_gives_it(text: str) -> None:
    model = embedder()
    assert model.token_ids(text) == tokenizer_ids(model, text)


class CountingTokenizer:
    """The tokenizer, with what it was asked to encode written down."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.asked: list[str] = []

    def encode(self, text: str, **options: Any) -> Any:
        self.asked.append(text)
        return self.tokenizer.encode(text, **options)


def test_only_the_chunks_with_other_characters_reach_the_tokenizer_and_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = embedder()
    counting = CountingTokenizer(model._tokenizer)
    text = "Thanks, I’ll send the café list tomorrow 👍 — zqxwv-unseen"
    expected = tokenizer_ids(model, text)
    monkeypatch.setattr(model, "_tokenizer", counting)
    monkeypatch.setattr(model, "_words", {})
    assert model.token_ids(text) == expected
    assert sorted(counting.asked) == sorted(
        [
            "thanks",
            ",",
            "I’ll",
            "send",
            "the",
            "café",
            "list",
            "tomorrow",
            "👍",
            "—",
            "zqxwv",
            "-",
            "unseen",
        ]
    )
    counting.asked.clear()
    assert model.token_ids(text) == expected
    assert counting.asked == []


def test_a_long_text_is_cut_where_the_tokenizer_cuts_it() -> None:
    model = embedder()
    text = " ".join(["pottery, painting and camping."] * 200)
    ids = model.token_ids(text)
    assert len(ids) == 512
    assert ids == tokenizer_ids(model, text)


def test_the_vector_is_the_mean_of_the_tokenizers_rows() -> None:
    model = embedder()
    text = "How did the support group meeting go yesterday?"
    expected = model.table[tokenizer_ids(model, text)].mean(axis=0)
    expected /= np.linalg.norm(expected)
    np.testing.assert_allclose(model.embed([text])[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not LOCOMO.is_dir(), reason=f"no LoCoMo data at {LOCOMO}")
def test_every_text_of_a_long_conversation_benchmark_has_the_tokenizers_ids() -> None:
    model = embedder()
    texts = strings(json.loads((LOCOMO / "locomo_dev.json").read_text(encoding="utf-8")))
    assert len(texts) > 10_000
    differ = [text for text in texts if model.token_ids(text) != tokenizer_ids(model, text)]
    assert differ == []
