"""The outbox sender: a reply delivered once, retried on time, given up on cleanly."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from channels.base import ChannelType, DeliveryReceipt, OutboundMessage
from errors import DeliveryError
from gateway.metrics import GatewayMetrics
from gateway.outbox import OutboxSender, RetryPolicy
from storage import driver_rows
from storage.database import Database
from storage.models import OutboundMessage as OutboundRow
from storage.repositories.outbox import OutboxRepository
from tests.gateway.outbox_rows import T0, enqueue


class SettableClock:
    """A clock that stands still until the test moves it."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class CountingStatements:
    """Counts the delivery marks (UPDATEs setting status 'delivered', which run through the
    driver: `storage.driver_rows`) and the transactions committed while the block runs: the
    engine's commits, and the statements on connections `Database.statement` lends (each
    commits by itself)."""

    def __init__(self, database: Database) -> None:
        self.engine = database.engine.sync_engine
        self.marks = 0
        self.commits = 0
        self._rows = driver_rows.rows

    def __enter__(self) -> CountingStatements:
        run_statement = self._rows

        async def counted(session: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
            if sql.startswith("UPDATE outbound_messages") and "'delivered'" in sql:
                self.marks += 1
            if isinstance(session, driver_rows.LentConnection):
                self.commits += 1
            return await run_statement(session, sql, *args, **kwargs)

        driver_rows.rows = counted  # type: ignore[assignment]
        event.listen(self.engine, "commit", self._commit)
        return self

    def __exit__(self, *_exc: object) -> None:
        driver_rows.rows = self._rows  # type: ignore[assignment]
        event.remove(self.engine, "commit", self._commit)

    def _commit(self, _conn: Any) -> None:
        self.commits += 1


class FlakyAdapter:
    """A channel adapter that raises `failures` (in order) before it delivers; records calls."""

    def __init__(
        self,
        channel_type: ChannelType = ChannelType.SLACK,
        failures: list[DeliveryError] | None = None,
        *,
        latency: float = 0.0,
    ) -> None:
        self.channel_type = channel_type
        self.failures = list(failures or [])
        self.latency = latency
        self.calls: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        self.calls.append(message)
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.failures:
            raise self.failures.pop(0)
        if message.message_id.endswith("-noid"):
            return DeliveryReceipt(platform_message_id=None)  # e.g. an SMTP server's answer
        return DeliveryReceipt(platform_message_id=f"platform-{message.message_id}")


async def stored(database: Database, row_id: int) -> OutboundRow:
    async with database.session() as db:
        row = await db.get(OutboundRow, row_id)
    assert row is not None
    return row


def sender_for(
    database: Database,
    adapter: FlakyAdapter,
    clock: SettableClock,
    policy: RetryPolicy | None = None,
) -> OutboxSender:
    return OutboxSender(
        database, {adapter.channel_type: adapter}, GatewayMetrics(), clock=clock, policy=policy
    )


async def test_a_reply_is_delivered_once_and_marked_with_the_platform_id(
    database: Database,
) -> None:
    row_id = await enqueue(database, thread_id="t-1")
    adapter = FlakyAdapter()
    clock = SettableClock()
    sender = sender_for(database, adapter, clock)

    assert await sender.send_due() == 1
    clock.advance(3600)
    assert await sender.send_due() == 0

    (sent,) = adapter.calls
    assert (sent.message_id, sent.channel_type, sent.channel_id) == ("out-1", "slack", "C1")
    assert (sent.thread_id, sent.in_reply_to, sent.content) == ("t-1", "in-1", "reply out-1")
    assert sent.reply_context == {"thread_ts": "1.2"}
    row = await stored(database, row_id)
    assert row.status == "delivered"
    assert row.platform_message_id == "platform-out-1"
    assert row.attempts == 1
    assert row.delivered_at == T0
    assert row.last_error is None
    metrics = sender.metrics.render().decode()
    assert 'gateway_messages_out_total{channel="slack",outcome="delivered"} 1.0' in metrics


async def test_replies_sent_together_are_marked_delivered_in_one_transaction(
    database: Database,
) -> None:
    ids = [await enqueue(database, f"out-{n:02}") for n in range(20)]
    ids.append(await enqueue(database, "out-20-noid"))
    adapter = FlakyAdapter()
    sender = sender_for(database, adapter, SettableClock())

    with CountingStatements(database) as counted:
        assert await sender.send_due() == 21

    # One transaction claims, one marks all 21 (one per reply without grouping: 1 + 21).
    assert (counted.marks, counted.commits) == (1, 2)
    rows = [await stored(database, row_id) for row_id in ids]
    assert {row.status for row in rows} == {"delivered"}
    assert {row.attempts for row in rows} == {1}
    assert {row.delivered_at for row in rows} == {T0}
    assert [row.platform_message_id for row in rows] == [
        *(f"platform-out-{n:02}" for n in range(20)),
        None,
    ]


async def test_a_reply_handed_over_at_once_is_marked_delivered_when_the_sender_stops(
    database: Database,
) -> None:
    async with database.session() as db:
        row = await OutboxRepository(db).enqueue(
            message_id="out-now",
            channel_type="slack",
            channel_id="C1",
            content="now",
            at=T0,
            claimed_until=T0 + timedelta(seconds=120),
        )
    adapter = FlakyAdapter(latency=0.01)
    sender = sender_for(database, adapter, SettableClock())
    sender.poll_interval = 0.01
    running = asyncio.create_task(sender.run())

    sender.send_now(row)
    sender.stop()
    await running

    assert [message.message_id for message in adapter.calls] == ["out-now"]
    stored_row = await stored(database, row.id)
    assert (stored_row.status, stored_row.platform_message_id) == (
        "delivered",
        "platform-out-now",
    )


async def test_retry_after_schedules_the_retry_exactly_then_and_success_marks_it_delivered(
    database: Database,
) -> None:
    row_id = await enqueue(database)
    adapter = FlakyAdapter(failures=[DeliveryError("rate limited", retry_after=2.5)])
    clock = SettableClock()
    sender = sender_for(database, adapter, clock)

    assert await sender.send_due() == 1
    row = await stored(database, row_id)
    assert row.status == "pending"
    assert row.attempts == 1
    assert row.next_attempt_at == T0 + timedelta(seconds=2.5)
    assert row.last_error == "rate limited"

    clock.advance(2.4)
    assert await sender.send_due() == 0
    assert len(adapter.calls) == 1

    clock.advance(0.1)
    assert await sender.send_due() == 1
    row = await stored(database, row_id)
    assert len(adapter.calls) == 2
    assert row.status == "delivered"
    assert row.attempts == 2
    assert row.platform_message_id == "platform-out-1"
    assert row.delivered_at == T0 + timedelta(seconds=2.5)
    assert row.last_error is None


def test_backoff_without_retry_after_grows_and_stays_within_half_to_full_ceiling() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=60.0)
    previous_max = 0.0
    for attempt in range(1, 12):
        ceiling = min(60.0, 1.0 * 2 ** (attempt - 1))
        samples = [policy.delay(attempt, None) for _ in range(200)]
        assert all(ceiling / 2 <= sample <= ceiling for sample in samples), (attempt, ceiling)
        if ceiling < 60.0:
            # Each attempt's range starts where the previous one ended: it only grows.
            assert min(samples) >= previous_max
        previous_max = max(samples)
        assert len(set(samples)) > 1  # jittered, not fixed


def test_retry_after_is_taken_as_given_but_capped_and_never_negative() -> None:
    policy = RetryPolicy(max_delay=300.0)
    assert policy.delay(1, 2.5) == 2.5
    assert policy.delay(7, 2.5) == 2.5
    assert policy.delay(1, 10_000.0) == 300.0
    assert policy.delay(1, -5.0) == 0.0


async def test_a_failure_without_retry_after_is_retried_after_jittered_backoff(
    database: Database,
) -> None:
    row_id = await enqueue(database)
    adapter = FlakyAdapter(failures=[DeliveryError("503"), DeliveryError("503")])
    clock = SettableClock()
    policy = RetryPolicy(base_delay=4.0, max_delay=100.0)
    sender = sender_for(database, adapter, clock, policy)

    await sender.send_due()
    first = (await stored(database, row_id)).next_attempt_at
    assert T0 + timedelta(seconds=2) <= first <= T0 + timedelta(seconds=4)

    clock.now = first
    await sender.send_due()
    second = (await stored(database, row_id)).next_attempt_at
    assert first + timedelta(seconds=4) <= second <= first + timedelta(seconds=8)


async def test_a_permanent_error_marks_the_reply_failed_at_once(database: Database) -> None:
    row_id = await enqueue(database)
    adapter = FlakyAdapter(failures=[DeliveryError("channel_not_found", permanent=True)])
    clock = SettableClock()
    sender = sender_for(database, adapter, clock)

    assert await sender.send_due() == 1
    clock.advance(86_400)
    assert await sender.send_due() == 0

    row = await stored(database, row_id)
    assert len(adapter.calls) == 1
    assert row.status == "failed"
    assert row.attempts == 1
    assert row.last_error == "channel_not_found"
    assert row.delivered_at is None
    metrics = sender.metrics.render().decode()
    assert 'gateway_messages_out_total{channel="slack",outcome="failed"} 1.0' in metrics


async def test_a_reply_is_marked_failed_after_max_attempts(database: Database) -> None:
    row_id = await enqueue(database)
    adapter = FlakyAdapter(failures=[DeliveryError(f"boom {n}") for n in range(10)])
    clock = SettableClock()
    policy = RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=1.0)
    sender = sender_for(database, adapter, clock, policy)

    for attempt in (1, 2):
        assert await sender.send_due() == 1
        row = await stored(database, row_id)
        assert (row.status, row.attempts) == ("pending", attempt)
        clock.advance(1.0)
    assert await sender.send_due() == 1
    clock.advance(3600)
    assert await sender.send_due() == 0

    row = await stored(database, row_id)
    assert len(adapter.calls) == 3
    assert row.status == "failed"
    assert row.attempts == 3
    assert row.last_error == "boom 2"


async def test_a_reply_for_a_channel_without_an_adapter_fails_permanently_with_a_reason(
    database: Database,
) -> None:
    row_id = await enqueue(database, channel=ChannelType.TEAMS)
    adapter = FlakyAdapter(ChannelType.SLACK)
    clock = SettableClock()
    sender = sender_for(database, adapter, clock)

    assert await sender.send_due() == 1
    clock.advance(86_400)
    assert await sender.send_due() == 0

    row = await stored(database, row_id)
    assert adapter.calls == []
    assert row.status == "failed"
    assert row.attempts == 1
    assert row.last_error is not None
    assert "teams" in row.last_error
    assert "not enabled" in row.last_error


async def test_one_failing_reply_does_not_hold_up_the_others(database: Database) -> None:
    ids = [await enqueue(database, f"out-{n}") for n in range(3)]
    adapter = FlakyAdapter(failures=[DeliveryError("first one fails", permanent=True)])
    sender = sender_for(database, adapter, SettableClock())

    assert await sender.send_due() == 3
    statuses = [(await stored(database, row_id)).status for row_id in ids]
    assert sorted(statuses) == ["delivered", "delivered", "failed"]


@pytest.mark.parametrize("database", ["postgres"], indirect=True)
async def test_two_senders_on_one_postgres_database_deliver_each_reply_exactly_once(
    database: Database,
) -> None:
    ids = [await enqueue(database, f"out-{n:03}") for n in range(60)]
    other = Database(database.url.render_as_string(hide_password=False), pool_size=4)
    adapter = FlakyAdapter(latency=0.005)
    clock = SettableClock()
    senders = [sender_for(database, adapter, clock), sender_for(other, adapter, clock)]
    for sender in senders:
        sender.poll_interval = 0.02
    try:
        tasks = [asyncio.create_task(sender.run()) for sender in senders]
        async with asyncio.timeout(20):
            while True:
                async with database.session() as db:
                    rows = list((await db.execute(select(OutboundRow))).scalars())
                if all(row.status == "delivered" for row in rows):
                    break
                await asyncio.sleep(0.02)
        for sender in senders:
            sender.stop()
        await asyncio.gather(*tasks)
    finally:
        await other.dispose()

    sent = Counter(message.message_id for message in adapter.calls)
    assert sorted(sent) == [f"out-{n:03}" for n in range(60)]
    assert set(sent.values()) == {1}
    assert {row.id for row in rows} == set(ids)
    assert all(row.attempts == 1 for row in rows)


async def test_a_reply_whose_sender_died_mid_send_is_handed_over_as_resumed(
    database: Database,
) -> None:
    crashed = await enqueue(database, "out-crashed")
    clock = SettableClock()
    async with database.session() as db:  # a sender claims it, then dies before any mark
        assert len(await OutboxRepository(db).claim_due(clock(), lease=RetryPolicy().lease)) == 1
    retried = await enqueue(database, "out-retried")
    adapter = FlakyAdapter(failures=[DeliveryError("slow down", retry_after=1.0)])
    sender = sender_for(database, adapter, clock)
    assert await sender.send_due() == 1  # out-retried fails once; out-crashed is leased
    clock.advance(RetryPolicy().lease.total_seconds())
    assert await sender.send_due() == 2
    assert sorted((call.message_id, call.resumed) for call in adapter.calls) == [
        ("out-crashed", True),
        ("out-retried", False),
        ("out-retried", False),
    ]
    for row_id in (crashed, retried):
        assert (await stored(database, row_id)).status == "delivered"
