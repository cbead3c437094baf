"""Generic hypothesis strategies of hostile input: nasty and huge text, arbitrary JSON values, a
valid document mutated (`mutated`) or damaged byte by byte (`damaged`), JSON the parser chokes on
(`HOSTILE_JSON`), a body over the size limit (`OVERSIZED`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from channels.web.adapter import MAX_BODY_BYTES

MAX_TEXT_CHARS = 16_000  # the channels' default max_text_chars
KeyPath = tuple[str | int, ...]

NASTY_STRINGS = [
    "",
    " ",
    "\t\r\n",
    "\x00",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "\u202eevil\u202c",
    "\u200b\ufeff",
    "😀" * 5,
    "Ω≈ç√∫",
    "null",
    "0",
    "-1",
    "1e300",
    "inf",
    "NaN",
    "9" * 40,
    "../../etc/passwd",
    "<script>alert(1)</script>",
    "%s%n{0}",
    "'; DROP TABLE inbound_events; --",
]
nasty_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(NASTY_STRINGS),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=10),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF), max_size=10),
)
huge_text = st.sampled_from([4_000, MAX_TEXT_CHARS + 1]).map(lambda n: "x" * n)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    nasty_text,
)
json_values = st.recursive(
    json_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=10), children, max_size=4),
    ),
    max_leaves=12,
)


def key_paths(node: Any, prefix: KeyPath = ()) -> Iterator[KeyPath]:
    """Every path of keys and indexes into `node`, the empty path (the root) first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from key_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from key_paths(value, (*prefix, index))


def _at(tree: Any, path: KeyPath) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@st.composite
def mutated(
    draw: st.DrawFn,
    base: Any,
    junk: st.SearchStrategy[Any],
    keys: st.SearchStrategy[str],
    protected: frozenset[str] = frozenset(),
) -> Any:
    """`base` after one to four mutations: a key or item dropped, a value replaced by junk (a
    wrong type, a huge or strange string, a nested structure), an unknown key added. Keys in
    `protected` are never touched."""
    tree = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = [p for p in key_paths(tree) if not any(part in protected for part in p)]
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["drop", "replace", "add"]))
        if not path:
            if operation == "replace":
                tree = draw(junk)
            elif isinstance(tree, dict):
                tree[draw(keys)] = draw(junk)
            continue
        parent, last = _at(tree, path[:-1]), path[-1]
        target = parent[last]
        if operation == "drop":
            del parent[last]
        elif operation == "add" and isinstance(target, dict):
            target[draw(keys)] = draw(junk)
        elif operation == "add" and isinstance(target, list):
            target.append(draw(junk))
        else:
            parent[last] = draw(junk)
    return tree


@st.composite
def json_bytes(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> bytes:
    """A JSON document of one of `values`, ASCII-escaped or as UTF-8 (lone surrogates then
    become invalid UTF-8, which must be refused)."""
    value = draw(values)
    if draw(st.booleans()):
        return json.dumps(value).encode()
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def damaged(draw: st.DrawFn, documents: st.SearchStrategy[bytes]) -> bytes:
    """A document cut short, or with bytes overwritten, inserted or deleted."""
    data = bytearray(draw(documents))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        operation = draw(st.sampled_from(["truncate", "overwrite", "insert", "delete"]))
        if operation == "truncate":
            del data[at:]
        elif operation == "overwrite" and at < len(data):
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif operation == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
    return bytes(data)


DEEP_JSON = b"[" * 5_000 + b"]" * 5_000  # deeper than the interpreter's recursion limit
HOSTILE_JSON = [
    DEEP_JSON,
    b'{"a":' + DEEP_JSON + b"}",
    b'{"a": ' + b"9" * 5_000 + b"}",
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"NaN",
    b'{"a": Infinity, "b": -Infinity, "c": NaN}',
    b"\xef\xbb\xbf{}",
    json.dumps({"a": 1}).encode("utf-16"),
    b'{"a": "\\ud800"}',
    b'{"a": 1, "a": 2}',
    b"{" + b'"k":1,' * 2_000 + b'"k":1}',
]


OVERSIZED = json.dumps({"user": "alice", "text": "hi", "pad": "x" * MAX_BODY_BYTES}).encode()


def with_surrogate(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Now and then a lone surrogate instead of a value: rare, as it is a known bug."""
    return st.one_of(values, values, values, values, st.just("id\ud800"))


# Ids a client may choose: the web channel's thread and message ids, mail's Message-IDs.
web_ids = st.from_regex(r"[A-Za-z0-9._:@+-]{1,24}", fullmatch=True)
