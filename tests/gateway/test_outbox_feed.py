"""The web feed over the outbox: the API's shape, paging, and a cursor that never skips a reply."""

from __future__ import annotations

from datetime import datetime, timedelta

from channels.base import ChannelType
from gateway.outbox import OutboxFeed
from storage.database import Database
from storage.repositories.outbox import OutboxRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.users import OrganizationRepository, UserRepository
from tests.gateway.outbox_rows import T0, enqueue


async def test_the_web_feed_gives_the_api_shape_and_strips_the_user_prefix(
    database: Database,
) -> None:
    first = await enqueue(
        database,
        "out-a",
        channel=ChannelType.WEB,
        channel_id="alice",
        in_reply_to="alice:m-1",
        thread_id="t-1",
    )
    await enqueue(
        database, "out-bob", channel=ChannelType.WEB, channel_id="bob", in_reply_to="bob:m-9"
    )
    await enqueue(database, "out-slack", channel=ChannelType.SLACK, channel_id="alice")
    second = await enqueue(
        database, "out-b", channel=ChannelType.WEB, channel_id="alice", in_reply_to=None
    )
    third = await enqueue(
        database,
        "out-c",
        channel=ChannelType.WEB,
        channel_id="alice",
        in_reply_to="alice:bob:x",
        at=T0 + timedelta(seconds=1),
    )
    feed = OutboxFeed(database)

    messages, cursor = await feed.replies("alice", after=0, limit=100)

    assert cursor == third
    assert [m["message_id"] for m in messages] == ["out-a", "out-b", "out-c"]
    assert messages[0] == {
        "message_id": "out-a",
        "role": "assistant",
        "text": "reply out-a",
        "session_id": None,
        "thread_id": "t-1",
        "in_reply_to": "m-1",
        "created_at": T0.isoformat(),
    }
    assert messages[1]["in_reply_to"] is None
    assert messages[1]["thread_id"] is None
    assert messages[2]["in_reply_to"] == "bob:x"  # only the owner's own prefix is stripped
    assert datetime.fromisoformat(messages[2]["created_at"]) == T0 + timedelta(seconds=1)

    page, page_cursor = await feed.replies("alice", after=0, limit=2)
    assert [m["message_id"] for m in page] == ["out-a", "out-b"]
    assert page_cursor == second
    rest, rest_cursor = await feed.replies("alice", after=page_cursor, limit=2)
    assert [m["message_id"] for m in rest] == ["out-c"]
    assert rest_cursor == third
    assert await feed.replies("alice", after=third, limit=100) == ([], third)
    assert first < second < third


async def test_the_feed_cursor_never_skips_a_reply_after_replies_were_deleted(
    database: Database,
) -> None:
    # Deleting a session (`/forget`, retention) deletes its replies; the reply that follows
    # must still come after every cursor handed out before, or the web client never sees it.
    async with database.session() as db:
        await OrganizationRepository(db).upsert("acme", "Acme")
        await UserRepository(db).upsert("alice", "acme", "Alice")
        session_id = (await SessionRepository(db).create("alice", "acme", at=T0)).id
    kept = await enqueue(database, "out-kept", channel=ChannelType.WEB, channel_id="alice")
    async with database.session() as db:
        for n in (1, 2):
            await OutboxRepository(db).enqueue(
                message_id=f"out-doomed-{n}",
                channel_type="web",
                channel_id="alice",
                content="private",
                at=T0,
                user_id="alice",
                session_id=session_id,
            )
    feed = OutboxFeed(database)
    seen, cursor = await feed.replies("alice", after=0, limit=100)
    assert [m["message_id"] for m in seen] == ["out-kept", "out-doomed-1", "out-doomed-2"]

    async with database.session() as db:
        assert await SessionRepository(db).delete(session_id)
    after_delete = await enqueue(database, "out-next", channel=ChannelType.WEB, channel_id="alice")
    messages, _ = await feed.replies("alice", after=cursor, limit=100)

    assert after_delete > cursor > kept
    assert [m["message_id"] for m in messages] == ["out-next"]
