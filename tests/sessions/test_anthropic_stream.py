"""Reading a streamed Messages API answer from its events, as plain data: the text as it
comes, the final message in the API's JSON shape, and what the stream may also carry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from sessions.anthropic_stream import StreamedMessage, StreamError, server_sent_events


async def lines_of(body: str) -> AsyncIterator[str]:
    for line in body.splitlines():
        yield line


async def events(body: str) -> list[tuple[str, str]]:
    return [event async for event in server_sent_events(lines_of(body))]


def fed(message: StreamedMessage, stream: Iterable[dict[str, Any]]) -> list[str]:
    return [text for event in stream if (text := message.feed(event))]


def started(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def stopped(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


OPENING = {
    "type": "message_start",
    "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 12}},
}
CLOSING = [
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
]


async def test_events_are_split_on_blank_lines_and_data_lines_are_joined() -> None:
    body = 'event: ping\ndata: {"type": "ping"}\n\n: a comment\ndata: {"a":\ndata: 1}\n\n'
    assert await events(body) == [("ping", '{"type": "ping"}'), ("message", '{"a":\n1}')]
    assert await events('event: message_stop\ndata: {"type": "message_stop"}') == [
        ("message_stop", '{"type": "message_stop"}')
    ]


def test_text_thinking_and_a_tool_call_make_the_message_the_plain_call_returns() -> None:
    message = StreamedMessage()
    tool_input = json.dumps({"name": "Acme", "fields": ["owner"]})
    stream = [
        OPENING,
        {"type": "ping"},
        started(0, {"type": "thinking", "thinking": ""}),
        delta(0, type="thinking_delta", thinking="Look it "),
        delta(0, type="thinking_delta", thinking="up."),
        delta(0, type="signature_delta", signature="sig"),
        stopped(0),
        started(1, {"type": "text", "text": "", "citations": None}),
        delta(1, type="text_delta", text="Let me "),
        delta(1, type="text_delta", text="check."),
        stopped(1),
        started(2, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        *(
            delta(2, type="input_json_delta", partial_json=tool_input[i : i + 5])
            for i in range(0, len(tool_input), 5)
        ),
        stopped(2),
        {"type": "a_future_event", "anything": True},
        *CLOSING,
    ]

    assert fed(message, stream) == ["Let me ", "check."]
    assert message.finished
    response = message.response()
    assert response.blocks == (
        {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "lookup",
            "input": {"name": "Acme", "fields": ["owner"]},
        },
    )
    assert (response.text, response.stop_reason, response.model) == (
        "Let me check.",
        "tool_use",
        "claude-x",
    )
    assert (response.input_tokens, response.output_tokens) == (12, 9)


def test_a_tool_call_without_input_gets_an_empty_one_and_citations_are_kept() -> None:
    message = StreamedMessage()
    citation = {"type": "char_location", "cited_text": "x", "document_index": 0}
    fed(
        message,
        [
            OPENING,
            started(0, {"type": "text", "text": ""}),
            delta(0, type="citations_delta", citation=citation),
            delta(0, type="text_delta", text="Cited."),
            stopped(0),
            started(1, {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}),
            stopped(1),
            *CLOSING,
        ],
    )
    assert message.response().blocks == (
        {"type": "text", "text": "Cited.", "citations": [citation]},
        {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
    )


def test_an_error_event_names_the_apis_error_type() -> None:
    message = StreamedMessage()
    fed(message, [OPENING, started(0, {"type": "text", "text": ""})])
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(StreamError, match="overloaded_error: Overloaded") as raised:
        message.feed(error)
    assert raised.value.error_type == "overloaded_error"
    assert not message.finished
