"""`gateway doctor --config F`: check what the gateway depends on and print a pass/fail table.

Checks, each with a time limit: the database (reachable, migrations applied), the transcript
store (writable), the outbound SMTP server (when email is on), Slack's `auth.test` (when Slack
is on), the Teams token endpoint (when Teams is on) and the Anthropic API (when a provider
other than the offline one is configured). Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.runtime import open_transcript_store
from gateway.settings import GatewayConfig
from storage.database import Database

CHECK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: its name, whether it passed, what it found, how long it took."""

    name: str
    status: str  # pass | fail | skip
    detail: str
    seconds: float

    def as_dict(self) -> dict[str, object]:
        """The result as JSON data."""
        return {
            "check": self.name,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


class SkippedError(Exception):
    """A check that does not apply to this configuration."""


async def run_checks(config: GatewayConfig) -> list[CheckResult]:
    """Every check, one after the other (each bounded by `CHECK_TIMEOUT_SECONDS`)."""
    checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
        ("database", lambda: check_database(config)),
        ("transcript store", lambda: check_transcripts(config)),
        ("smtp (outbound)", lambda: check_smtp(config)),
        ("slack auth.test", lambda: check_slack(config)),
        ("teams token", lambda: check_teams(config)),
        ("anthropic api", lambda: check_anthropic(config)),
    ]
    results = []
    for name, check in checks:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                detail = await check()
            status = "pass"
        except SkippedError as exc:
            status, detail = "skip", str(exc)
        except TimeoutError:
            status, detail = "fail", f"no answer within {CHECK_TIMEOUT_SECONDS:.0f}s"
        except Exception as exc:  # noqa: BLE001 (a doctor reports every failure, whatever it is)
            status, detail = "fail", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        results.append(CheckResult(name, status, detail, time.perf_counter() - started))
    return results


async def check_database(config: GatewayConfig) -> str:
    """Reachable, and at the newest migration."""
    database = Database(config.storage.database_url, pool_size=1)
    try:
        await database.ping()
        current = await database.current_revision()
        head = database.head_revision()
    finally:
        await database.dispose()
    if current != head:
        raise RuntimeError(
            f"{database.display_url} is at revision {current}, not {head}: run `gateway db upgrade`"
        )
    return f"{database.display_url} at revision {current}"


async def check_transcripts(config: GatewayConfig) -> str:
    """The store answers and accepts a write (`TranscriptStore.check`)."""
    store = open_transcript_store(config.storage.transcripts)
    await store.check()
    settings = config.storage.transcripts
    return f"s3://{settings.s3.bucket}" if settings.backend == "s3" else str(settings.local_path)


async def check_smtp(config: GatewayConfig) -> str:
    """The outbound SMTP server greets us (and accepts the login, when one is configured)."""
    email = config.channels.email
    if not email.enabled:
        raise SkippedError("the email channel is off")
    import aiosmtplib  # noqa: PLC0415

    outbound = email.outbound
    client = aiosmtplib.SMTP(
        hostname=outbound.host, port=outbound.port, start_tls=outbound.starttls or None
    )
    async with client:
        if outbound.username:
            await client.login(outbound.username, outbound.password.get_secret_value())
        return f"{outbound.host}:{outbound.port} {(client.esmtp_extensions and 'ESMTP') or 'SMTP'}"


async def check_slack(config: GatewayConfig) -> str:
    """Slack accepts the bot token."""
    slack = config.channels.slack
    if not slack.enabled:
        raise SkippedError("the Slack channel is off")
    from slack_sdk.web.async_client import AsyncWebClient  # noqa: PLC0415

    client = AsyncWebClient(token=slack.bot_token.get_secret_value(), base_url=slack.api_base_url)
    answer = await client.auth_test()
    return f"team {answer.get('team_id')} as {answer.get('user')} ({answer.get('user_id')})"


async def check_teams(config: GatewayConfig) -> str:
    """The token endpoint issues the bot a token for the Bot Connector."""
    teams = config.channels.teams
    if not teams.enabled:
        raise SkippedError("the Teams channel is off")
    if teams.insecure_dev_mode and not teams.app_id:
        raise SkippedError("insecure_dev_mode without an app id")
    import httpx  # noqa: PLC0415

    url = teams.oauth_token_url or (
        "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
    )
    async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_SECONDS) as client:
        answer = await client.post(
            url,
            data={
                "grant_type": "client_credentials",
                "client_id": teams.app_id,
                "client_secret": teams.app_password.get_secret_value(),
                "scope": "https://api.botframework.com/.default",
            },
        )
    if answer.status_code != 200 or "access_token" not in answer.json():
        raise RuntimeError(f"{url} answered {answer.status_code}: {answer.text[:200]}")
    return f"token issued by {url}"


async def check_anthropic(config: GatewayConfig) -> str:
    """The Anthropic API answers with the configured key (lists one model)."""
    llm = config.llm
    provider = llm.provider
    if provider == "auto":
        provider = "anthropic" if llm.api_key.get_secret_value() else "offline"
    if provider == "offline":
        raise SkippedError("the offline provider needs no network")
    if provider != "anthropic":
        raise SkippedError(f"{provider}: use the cloud's own tools to check access")
    import anthropic  # noqa: PLC0415

    client = anthropic.AsyncAnthropic(
        api_key=llm.api_key.get_secret_value(), base_url=llm.base_url, max_retries=0
    )
    try:
        page = await client.models.list(limit=1)
    finally:
        await client.close()
    first = page.data[0].id if page.data else "no models"
    return f"{llm.base_url or 'api.anthropic.com'} answers ({first})"


def table(results: list[CheckResult]) -> str:
    """The results as a readable table."""
    width = max(len(result.name) for result in results)
    lines = [f"{'CHECK'.ljust(width)}  STATUS  DETAIL"]
    for result in results:
        lines.append(f"{result.name.ljust(width)}  {result.status.upper():<6}  {result.detail}")
    return "\n".join(lines)
