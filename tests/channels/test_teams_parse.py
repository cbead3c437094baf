"""Teams activities (shaped like the Bot Framework's documented Teams payloads) to
`ChannelMessage`s: pure parsing, no I/O."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from channels.base import Attachment, ChannelMessage, ChannelType
from channels.teams.parse import (
    bot_was_added,
    conversation_reference,
    ignore_reason,
    parse_teams_activity,
    split_conversation_id,
    teams_text,
)
from errors import ChannelPayloadError

APP_ID = "2b7e6a0c-3f4d-4c1a-9e2b-5d6f7a8b9c0d"
BOT = f"28:{APP_ID}"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
AAD = "6b4d2c1e-0000-4000-8000-00000000a11c"
SERVICE_URL = "https://smba.trafficmanager.net/amer/"
CHANNEL = "19:general@thread.tacv2"
RECEIVED = datetime(2025, 6, 1, 12, 30, tzinfo=UTC)


def activity(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "message",
        "id": "1717243200001",
        "timestamp": "2025-06-01T12:00:00.1234567Z",
        "localTimestamp": "2025-06-01T14:00:00.1234567+02:00",
        "serviceUrl": SERVICE_URL,
        "channelId": "msteams",
        "from": {"id": "29:1alice", "name": "Alice", "aadObjectId": AAD},
        "conversation": {"id": "a:1chat", "conversationType": "personal", "tenantId": TENANT},
        "recipient": {"id": BOT, "name": "Assistant"},
        "textFormat": "plain",
        "text": "hello",
        "locale": "en-US",
        "channelData": {"tenant": {"id": TENANT}},
    }
    base.update(fields)
    return base


def mention(name: str = "Assistant", mentioned_id: str = BOT) -> dict[str, Any]:
    return {
        "type": "mention",
        "text": f"<at>{name}</at>",
        "mentioned": {"id": mentioned_id, "name": name},
    }


def channel_post(text: str, *, conversation_id: str, **fields: Any) -> dict[str, Any]:
    conversation = {
        "id": conversation_id,
        "conversationType": "channel",
        "isGroup": True,
        "tenantId": TENANT,
    }
    return activity(
        **{"text": text, "entities": [mention()], "conversation": conversation, **fields}
    )


def parse(payload: dict[str, Any]) -> ChannelMessage:
    message = parse_teams_activity(payload, bot_id=APP_ID, received_at=RECEIVED)
    assert message is not None, ignore_reason(payload, bot_id=APP_ID)
    return message


def test_a_personal_message_is_normalised() -> None:
    payload = activity()
    message = parse(payload)
    assert message.channel_type is ChannelType.TEAMS
    assert message.channel_id == "a:1chat"
    assert message.message_id == "a:1chat|1717243200001"
    assert message.user_identifier == AAD
    assert message.tenant == TENANT
    assert message.content == "hello"
    assert message.thread_id == ""
    assert message.timestamp == datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert message.raw == payload


def test_the_reply_context_is_a_json_conversation_reference() -> None:
    message = parse(activity())
    assert message.reply_context == {
        "conversation_reference": {
            "activityId": "1717243200001",
            "user": {"id": "29:1alice", "name": "Alice", "aadObjectId": AAD},
            "bot": {"id": BOT, "name": "Assistant"},
            "conversation": {"id": "a:1chat", "conversationType": "personal", "tenantId": TENANT},
            "channelId": "msteams",
            "locale": "en-US",
            "serviceUrl": SERVICE_URL,
        },
        "thread_root": "",
    }
    assert json.loads(json.dumps(message.to_record()))["reply_context"] == message.reply_context


def test_a_channel_mention_has_the_mention_text_stripped() -> None:
    payload = channel_post(
        "<at>Assistant</at> summarise this thread", conversation_id=f"{CHANNEL};messageid=1700"
    )
    message = parse(payload)
    assert message.content == "summarise this thread"
    assert message.channel_id == CHANNEL


def test_a_mention_in_the_middle_and_other_people_s_mentions_read_naturally() -> None:
    payload = channel_post(
        "Ask <at>Bob</at> or <at>Assistant</at>, please",
        conversation_id=f"{CHANNEL};messageid=1700",
    )
    payload["entities"].append(mention("Bob", "29:1bob"))
    assert parse(payload).content == "Ask @Bob or , please"


def test_a_reply_in_a_channel_thread_maps_to_the_root_of_its_reply_chain() -> None:
    payload = channel_post(
        "<at>Assistant</at> and now?",
        conversation_id=f"{CHANNEL};messageid=1717243100000",
        id="1717243200005",
        replyToId="1717243100000",
    )
    message = parse(payload)
    assert message.thread_id == "1717243100000"
    assert message.channel_id == CHANNEL
    reference = message.reply_context["conversation_reference"]
    assert reference["conversation"]["id"] == f"{CHANNEL};messageid=1717243100000"
    assert reference["activityId"] == "1717243200005"
    assert message.reply_context["thread_root"] == "1717243100000"


def test_the_reply_chain_root_comes_from_reply_to_id_without_a_suffix() -> None:
    payload = channel_post(
        "<at>Assistant</at> hi", conversation_id=CHANNEL, replyToId="1717243100000"
    )
    assert parse(payload).thread_id == "1717243100000"


def test_a_top_level_channel_post_starts_a_reply_chain_rooted_at_itself() -> None:
    payload = channel_post("<at>Assistant</at> hi", conversation_id=CHANNEL, id="1717243300000")
    assert parse(payload).thread_id == "1717243300000"


def test_a_group_chat_mention_has_no_thread() -> None:
    payload = activity(
        text="<at>Assistant</at> hi",
        entities=[mention()],
        conversation={"id": "19:group@thread.v2", "conversationType": "groupChat", "isGroup": True},
    )
    message = parse(payload)
    assert message.thread_id == ""
    assert message.tenant == TENANT


def test_html_content_becomes_text() -> None:
    payload = activity(
        textFormat="xml",
        text="<p>Two things:</p><ul><li>one &amp; two</li><li><strong>three</strong></li></ul>",
    )
    assert parse(payload).content == "Two things:\n\n  * one & two\n  * three"


def test_a_mention_inside_html_is_stripped_too() -> None:
    payload = channel_post(
        "<p><at>Assistant</at>&nbsp;status?</p>", conversation_id=f"{CHANNEL};messageid=1700"
    )
    assert parse(payload).content == "status?"


def test_plain_text_with_angle_brackets_is_left_alone() -> None:
    assert parse(activity(text="if a < b and c > d")).content == "if a < b and c > d"


def test_attachments_keep_their_metadata_and_the_html_copy_is_dropped() -> None:
    payload = activity(
        text="see the file",
        attachments=[
            {"contentType": "text/html", "content": "<div>see the file</div>"},
            {
                "contentType": "application/vnd.microsoft.teams.file.download.info",
                "name": "report.pdf",
                "contentUrl": "https://contoso.sharepoint.com/report.pdf",
                "content": {
                    "downloadUrl": "https://download.example/report.pdf?token=x",
                    "uniqueId": "1150D938",
                    "fileType": "pdf",
                },
            },
            {"contentType": "image/png", "contentUrl": "https://smba.example/img/1"},
        ],
    )
    assert parse(payload).attachments == (
        Attachment(
            filename="report.pdf",
            content_type="application/pdf",
            size=0,
            url="https://download.example/report.pdf?token=x",
            source={"teams_download": "https://download.example/report.pdf?token=x"},
        ),
        Attachment(
            filename="attachment",
            content_type="image/png",
            size=0,
            url="https://smba.example/img/1",
            source={"teams_content": "https://smba.example/img/1", "service_url": SERVICE_URL},
        ),
    )


def test_a_file_without_text_is_still_a_message() -> None:
    payload = activity(text="", attachments=[{"contentType": "image/png", "contentUrl": "u"}])
    assert parse(payload).content == ""


def test_a_missing_timestamp_falls_back_to_the_receipt_time() -> None:
    payload = activity()
    del payload["timestamp"]
    assert parse(payload).timestamp == RECEIVED


def test_the_tenant_falls_back_to_the_conversation() -> None:
    payload = activity(channelData={})
    assert parse(payload).tenant == TENANT


def test_bot_added_to_a_conversation_is_recognised() -> None:
    update = activity(type="conversationUpdate", membersAdded=[{"id": BOT}], text=None)
    assert bot_was_added(update, bot_id=APP_ID)
    assert parse_teams_activity(update, bot_id=APP_ID) is None
    assert "conversationUpdate" in (ignore_reason(update, bot_id=APP_ID) or "")
    # The welcome starts a new message rather than answering an activity.
    assert "activityId" not in conversation_reference(update)


def test_someone_else_added_is_not_the_bot_being_added() -> None:
    update = activity(type="conversationUpdate", membersAdded=[{"id": "29:1bob"}])
    assert not bot_was_added(update, bot_id=APP_ID)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (
            channel_post("no mention here", conversation_id=CHANNEL, entities=[]),
            "without a mention",
        ),
        (
            channel_post(
                "<at>Bob</at> hi", conversation_id=CHANNEL, entities=[mention("Bob", "29:1bob")]
            ),
            "without a mention",
        ),
        (activity(type="typing"), "is not a message"),
        (activity(type="invoke", name="adaptiveCard/action"), "is not a message"),
        (activity(**{"from": {"id": BOT, "name": "Assistant"}}), "the bot itself"),
        (activity(**{"from": {"id": "29:1guest", "name": "Guest"}}), "no AAD object id"),
        (activity(text="   "), "empty message"),
    ],
)
def test_what_the_gateway_ignores(payload: dict[str, Any], reason: str) -> None:
    assert parse_teams_activity(payload, bot_id=APP_ID, received_at=RECEIVED) is None
    assert reason in (ignore_reason(payload, bot_id=APP_ID) or "")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"id": None}, "needs 'id'"),
        ({"conversation": {"conversationType": "personal"}}, "conversation.id"),
        ({"serviceUrl": ""}, "serviceUrl"),
        ({"timestamp": "yesterday"}, "invalid activity timestamp"),
    ],
)
def test_a_message_missing_what_every_message_has_is_a_payload_error(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ChannelPayloadError, match=problem):
        parse_teams_activity(activity(**change), bot_id=APP_ID, received_at=RECEIVED)


def test_split_conversation_id() -> None:
    assert split_conversation_id(f"{CHANNEL};messageid=17") == (CHANNEL, "17")
    assert split_conversation_id("a:1chat") == ("a:1chat", "")


def test_teams_text_handles_mentions_without_entities_text() -> None:
    assert teams_text("<at>Carol</at> hi") == "@Carol hi"
