"""The machinery of the fuzz tests: a gateway run in an event loop on a thread of its own
(`LoopThread`, `gateway_on`) that synchronous hypothesis examples send requests to (`Target`), the
health and settle checks every fuzz test ends with, the list of known bugs the fuzz tests tolerate,
and the hypothesis settings they share."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import select

from gateway.settings import GatewayConfig
from storage.models import InboundEvent, InboundStatus
from tests.e2e.harness import RunningGateway, running_gateway

T = TypeVar("T")

ANSWER_SECONDS = 20.0  # longer than this without an answer is a hang
SETTLE_SECONDS = 60.0  # the dispatcher finishes every accepted message within this

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)

# --- known bugs -------------------------------------------------------------------------------

KNOWN_BUGS: dict[str, str] = {}


def known_bug(bug: str) -> list[pytest.MarkDecorator]:
    """The marks of a regression case of `bug`: strict xfail while the bug is listed."""
    if bug in KNOWN_BUGS:
        return [pytest.mark.xfail(strict=True, reason=f"{bug}: {KNOWN_BUGS[bug]}")]
    return []


def tolerated(bug: str | None) -> bool:
    """Whether a failure caused by an input of class `bug` is a known, listed bug."""
    return bug is not None and bug in KNOWN_BUGS


def json_failure(raw: bytes) -> str | None:
    """The known bug a body's JSON parsing runs into (None when json.loads copes with it)."""
    try:
        json.loads(raw)
    except RecursionError:
        return "json-nesting"
    except json.JSONDecodeError:
        return None
    except UnicodeDecodeError:
        return None
    except ValueError:
        return "json-big-int"
    return None


def has_surrogate(value: Any) -> bool:
    """Whether a lone UTF-16 surrogate hides in any string (or key) of `value`."""
    if isinstance(value, str):
        return any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, Mapping):
        return any(has_surrogate(key) or has_surrogate(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(has_surrogate(item) for item in value)
    return False


# --- an event loop on a thread of its own -----------------------------------------------------


class LoopThread:
    """An asyncio loop running in a thread: synchronous hypothesis examples hand it coroutines
    (`run`) and wait for their results, while the servers started in it keep serving."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = ANSWER_SECONDS) -> T:
        """The coroutine's result; an AssertionError (a hang) when it takes over `timeout`."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"no answer within {timeout} s: a hang") from None

    def close(self) -> None:
        """Cancel what is left, stop the loop and join the thread."""

        async def cancel_the_rest() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        self.run(cancel_the_rest(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, read to the end."""

    status: int
    text: str

    @property
    def reason(self) -> str:
        """The reason of a refusal: the JSON body's "error", else the plain-text body."""
        try:
            data = json.loads(self.text)
        except ValueError:
            return self.text.strip()
        return str(data.get("error") or "").strip() if isinstance(data, dict) else ""


@dataclass
class Target:
    """A running gateway and the loop it runs in."""

    loop: LoopThread
    gateway: RunningGateway

    def post(self, path: str, content: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `content`; the answer (an AssertionError when none comes in time)."""

        async def post() -> Answer:
            response = await self.gateway.client.post(path, content=content, headers=headers)
            return Answer(response.status_code, response.text)

        return self.loop.run(post())

    def get(self, path: str) -> Answer:
        """GET `path`."""

        async def get() -> Answer:
            response = await self.gateway.client.get(path)
            return Answer(response.status_code, response.text)

        return self.loop.run(get())

    def assert_healthy(self) -> None:
        """Liveness and readiness answer 200 and the background loops still run."""
        assert self.get("/healthz").status == 200
        assert self.get("/readyz").status == 200
        # A bad payload must not have killed the dispatcher, the outbox or the job loops.
        loops = self.gateway.runtime._tasks
        assert loops
        assert all(not task.done() for task in loops), [t for t in loops if t.done()]

    def events(self) -> list[InboundEvent]:
        """Every inbound event in the database."""

        async def events() -> list[InboundEvent]:
            async with self.gateway.runtime.database.session() as db:
                return list((await db.execute(select(InboundEvent))).scalars())

        return self.loop.run(events())

    def settle(self) -> list[InboundEvent]:
        """Wait until every accepted message is finished; the events whose turn failed."""

        async def settle() -> list[InboundEvent]:
            deadline = time.monotonic() + SETTLE_SECONDS
            while True:
                async with self.gateway.runtime.database.session() as db:
                    events = list((await db.execute(select(InboundEvent))).scalars())
                pending = [e for e in events if e.status == InboundStatus.PENDING]
                if not pending:
                    return [e for e in events if e.attempts or e.status == InboundStatus.FAILED]
                if time.monotonic() > deadline:
                    raise AssertionError(f"{len(pending)} messages still pending: a hang")
                await asyncio.sleep(0.2)

        return self.loop.run(settle(), timeout=SETTLE_SECONDS + 10)

    def assert_no_failed_turns(self) -> None:
        """No turn failed, except on messages of a known bug class."""
        for failed in self.settle():
            bug = "surrogates" if has_surrogate(failed.message) else None
            assert tolerated(bug), f"a turn failed on {failed.message}: {failed.error}"


@contextlib.contextmanager
def gateway_on(loop: LoopThread, config: GatewayConfig) -> Iterator[Target]:
    """Run a whole gateway with `config` in `loop` for the duration of the block."""
    stack = contextlib.AsyncExitStack()
    gateway = loop.run(stack.enter_async_context(running_gateway(config)), timeout=60)
    try:
        yield Target(loop, gateway)
    finally:
        loop.run(stack.aclose(), timeout=90)


def sqlite_url(folder: Path) -> str:
    return f"sqlite+aiosqlite:///{folder / 'gateway.db'}"
