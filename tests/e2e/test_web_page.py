"""The chat page in a real browser (Debian's chromium, driven by playwright): the history on
load, sending, the live status and growing answer replaced by the final message, escaping,
the bearer token on the stream, the fallback to polling, files attached to a message; and
against a whole gateway, a conversation (with a file) that is still there after a reload.
Skipped when no chromium is installed."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright, expect

from channels.files import FileLimits
from channels.web.live import LiveHub
from tests.channels.web_channel_harness import TOKEN, MemoryStash, ServedWeb, serve_web
from tests.e2e.harness import gateway_config, running_gateway

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary installed")

XSS = 'Hello <img src=x onerror="window.pwned=1"> <script>window.pwned=1</script>'


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    """A fresh browser page; fails the test on any uncaught script error."""
    errors: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            tab = await browser.new_page()
            tab.on("pageerror", lambda error: errors.append(str(error)))
            yield tab
        finally:
            await browser.close()
    assert errors == []


async def streams_of(web: ServedWeb, user: str, count: int) -> None:
    async with asyncio.timeout(10):
        while web.channel.hub.streams(user) != count:
            await asyncio.sleep(0.02)


async def test_the_page_shows_the_history_then_the_answer_as_it_is_written(page: Page) -> None:
    async with serve_web(dev_open=False) as web:
        web.history.messages["alice"] = [
            {**web.feed.commit("alice", "an earlier answer"), "role": "assistant"},
        ]
        web.history.messages["alice"].insert(
            0,
            {
                "message_id": "m-0",
                "role": "user",
                "text": "an earlier question",
                "session_id": "s-1",
                "thread_id": None,
                "in_reply_to": None,
                "created_at": "2025-06-01T11:59:00+00:00",
            },
        )
        web.history.cursor = 1
        await page.goto(f"{web.base_url}/web/")
        # Without a token the history is refused; with it, it loads and the stream opens
        # with the bearer token (fetch, not EventSource, which cannot send one).
        await expect(page.locator("#status")).to_have_text("missing bearer token")
        await page.fill("#token", TOKEN)
        await page.locator("#token").dispatch_event("change")
        log = page.locator("#log .msg")
        await expect(log).to_have_count(2)
        await expect(log.nth(0)).to_have_class("msg user")
        await expect(log.nth(0)).to_have_text("an earlier question")
        await expect(log.nth(1).locator(".body")).to_have_text("an earlier answer")
        await streams_of(web, "alice", 1)
        await expect(page.locator("body")).to_have_attribute("data-feed", "stream")

        await page.fill("#text", "a <b>bold</b> question")
        # Leaving the token field fires its "change" again; the same token does not reload
        # the page (a reload would clear the message about to be sent).
        assert await page.evaluate("generation") == 2
        await page.press("#text", "Enter")
        await expect(log).to_have_count(3)
        await expect(log.nth(2).locator(".body")).to_have_text("a <b>bold</b> question")
        [sent] = web.inbox.accepted
        assert sent.content == "a <b>bold</b> question"
        client_id = sent.reply_context["client_message_id"]

        live = web.channel.live_reply(web.target("alice", client_id))
        assert live is not None
        await live.status("Thinking…")
        bubble = page.locator("#log .msg.live")
        await expect(bubble.locator(".status")).to_have_text("Thinking…")
        await live.text("Hello")
        await expect(bubble.locator(".body")).to_have_text("Hello")
        await expect(bubble.locator(".status")).to_have_text("")
        await live.text(XSS)
        await expect(bubble.locator(".body")).to_have_text(XSS)

        web.feed.commit("alice", XSS + " (final)", in_reply_to=client_id)
        await live.close(committed=True)
        await expect(page.locator("#log .msg.live")).to_have_count(0)
        await expect(log).to_have_count(4)
        await expect(log.nth(3).locator(".body")).to_have_text(XSS + " (final)")
        assert await page.locator("#log img, #log script, #log b").count() == 0
        assert await page.evaluate("window.pwned") is None
        assert client_id not in (await page.locator("#status").text_content() or "")


async def test_an_answer_without_a_reply_leaves_no_live_bubble(page: Page) -> None:
    async with serve_web() as web:
        await page.goto(f"{web.base_url}/web/")
        await streams_of(web, "alice", 1)
        live = web.channel.live_reply(web.target("alice", "m-1"))
        assert live is not None
        await live.status("Thinking…")
        await expect(page.locator("#log .msg.live .status")).to_have_text("Thinking…")
        await live.close(committed=False)
        await expect(page.locator("#log .msg")).to_have_count(0)


async def test_the_page_reconnects_from_its_cursor_when_a_stream_ends(page: Page) -> None:
    async with serve_web() as web:
        web.feed.commit("alice", "before the page")
        await page.goto(f"{web.base_url}/web/")
        await expect(page.locator("#log .msg")).to_have_count(1)
        await streams_of(web, "alice", 1)
        web.channel.hub.close()  # every open stream ends; the page comes back
        web.channel.hub = LiveHub()
        await streams_of(web, "alice", 1)
        web.feed.commit("alice", "after the reconnect")
        await expect(page.locator("#log .msg")).to_have_count(2)
        await expect(page.locator("#log .msg .body").nth(1)).to_have_text("after the reconnect")


async def test_the_page_falls_back_to_polling_when_streams_fail(page: Page) -> None:
    async with serve_web(hub=LiveHub(max_streams_per_user=0)) as web:
        await page.goto(f"{web.base_url}/web/")
        await expect(page.locator("body")).to_have_attribute("data-feed", "polling")
        web.feed.commit("alice", "read by polling")
        await expect(page.locator("#log .msg .body")).to_have_text(["read by polling"])
    assert {status for status, _ in web.rejections} == {429}


async def test_a_conversation_with_the_gateway_survives_a_reload(
    page: Page, tmp_path: Path
) -> None:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        await gateway.post("alice", "an earlier question", message_id="m-0")
        await gateway.wait_for_replies("alice", 1, settle=0)
        url = str(gateway.client.base_url.join("/web/"))
        await page.goto(url)
        log = page.locator("#log .msg")
        await expect(log).to_have_count(2)
        await expect(page.locator("body")).to_have_attribute("data-feed", "stream")
        await page.fill("#text", "what now?")
        await page.press("#text", "Enter")
        await expect(log.nth(2).locator(".body")).to_have_text("what now?")
        await expect(log.nth(3).locator(".body")).to_contain_text("«what now?»", timeout=15_000)
        await expect(page.locator("#log .msg.live")).to_have_count(0)

        await page.reload()
        await expect(log).to_have_count(4)
        roles = await log.evaluate_all("nodes => nodes.map(n => n.className)")
        assert roles == ["msg user", "msg assistant", "msg user", "msg assistant"]
        await expect(log.nth(2).locator(".body")).to_have_text("what now?")
        # Close the page before the gateway stops: its open stream would hold the server.
        await page.close()


NOTES = {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"The budget is 12,400 EUR.\n"}
REPORT = {"name": "report.pdf", "mimeType": "application/pdf", "buffer": b"%PDF-1.4\n%%EOF\n"}


async def test_files_are_chosen_shown_and_sent_with_the_message(page: Page) -> None:
    stash = MemoryStash()
    limits = FileLimits(max_file_bytes=1024, max_message_bytes=4096, max_files=2)
    async with serve_web(stash=stash, limits=limits) as web:
        await page.goto(f"{web.base_url}/web/")
        await streams_of(web, "alice", 1)
        await page.set_input_files("#files", files=[NOTES, REPORT])
        await expect(page.locator("#chosen")).to_have_text("notes.txt, report.pdf")

        await page.fill("#text", "what do these say?")
        await page.press("#text", "Enter")
        mine = page.locator("#log .msg.user")
        await expect(mine.locator(".body")).to_have_text("what do these say?")
        await expect(mine.locator(".files")).to_have_text("Attached: notes.txt, report.pdf")
        await expect(page.locator("#chosen")).to_have_text("")
        async with asyncio.timeout(10):
            while not web.inbox.accepted:
                await asyncio.sleep(0.02)
        [sent] = web.inbox.accepted
        assert sent.content == "what do these say?"
        assert [(a.filename, a.content_type) for a in sent.attachments] == [
            ("notes.txt", "text/plain"),
            ("report.pdf", "application/pdf"),
        ]
        assert [stash.kept[a.source["stash"]] for a in sent.attachments] == [
            NOTES["buffer"],
            REPORT["buffer"],
        ]

        # A file alone is a message too.
        await page.set_input_files("#files", files=[NOTES])
        await page.click("#form button")
        await expect(mine).to_have_count(2)
        await expect(mine.nth(1).locator(".files")).to_have_text("Attached: notes.txt")
        async with asyncio.timeout(10):
            while len(web.inbox.accepted) < 2:
                await asyncio.sleep(0.02)
        assert web.inbox.accepted[1].content == ""


async def test_files_over_the_limits_are_refused_on_the_page_and_by_the_server(page: Page) -> None:
    limits = FileLimits(max_file_bytes=1024, max_message_bytes=4096, max_files=2)
    big = {"name": "scan.pdf", "mimeType": "application/pdf", "buffer": b"0" * 3000}
    async with serve_web(stash=MemoryStash(failing_after=0), limits=limits) as web:
        await page.goto(f"{web.base_url}/web/")
        await streams_of(web, "alice", 1)
        await page.set_input_files("#files", files=[big])
        chosen = page.locator("#chosen")
        await expect(chosen).to_have_text("scan.pdf is too large (3 KB, limit 1 KB)")
        await expect(chosen).to_have_class("meta error")
        await page.fill("#text", "read it")
        await page.press("#text", "Enter")
        await expect(page.locator("#log .msg")).to_have_count(0)  # nothing was sent

        # The server refuses what the page lets through (its stash is down): the message and
        # its files are back in the form, to send again.
        await page.set_input_files("#files", files=[NOTES])
        await page.press("#text", "Enter")
        await expect(page.locator("#log .msg.error .body")).to_have_text(
            "the files could not be stored: the store is down"
        )
        await expect(page.locator("#text")).to_have_value("read it")
        await expect(chosen).to_have_text("notes.txt")
    assert web.inbox.accepted == []


async def test_without_file_uploads_the_page_has_no_attach_button(page: Page) -> None:
    async with serve_web() as web:
        await page.goto(f"{web.base_url}/web/")
        await expect(page.locator("#attach")).to_be_hidden()


async def test_a_file_sent_to_the_gateway_is_answered_and_named_after_a_reload(
    page: Page, tmp_path: Path
) -> None:
    config = gateway_config(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path)
    async with running_gateway(config) as gateway:
        await page.goto(str(gateway.client.base_url.join("/web/")))
        await expect(page.locator("body")).to_have_attribute("data-feed", "stream")
        await page.set_input_files("#files", files=[NOTES])
        await page.fill("#text", "what is the budget?")
        await page.press("#text", "Enter")
        log = page.locator("#log .msg")
        await expect(log.nth(1).locator(".body")).to_contain_text("12,400 EUR", timeout=15_000)

        await page.reload()
        await expect(log).to_have_count(2)
        await expect(log.nth(0).locator(".body")).to_have_text("what is the budget?")
        await expect(log.nth(0).locator(".files")).to_have_text("Attached: notes.txt")
        await page.close()
