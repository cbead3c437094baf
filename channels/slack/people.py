"""Who Slack users are: display names for the mentions in a message and email addresses for
`link_by_email`, from `users.info`, cached for an hour."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from primitives.bounded_cache import BoundedCache

log = structlog.stdlib.get_logger(__name__)

NAME_CACHE_SECONDS = 3600.0
CACHED_ENTRIES = 10_000  # people, mention threads and notices kept at most (each)
LOOKUP_TIMEOUT_SECONDS = 1.0
MAX_NAME_LOOKUPS = 20
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)>")


@dataclass(frozen=True, slots=True)
class _Person:
    name: str
    email: str | None


class SlackPeople:
    """Slack users' names and email addresses, looked up with the bot's client."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._people: BoundedCache[str, _Person] = BoundedCache(
            CACHED_ENTRIES, ttl=NAME_CACHE_SECONDS
        )

    async def names(
        self, text: str, authors: Iterable[str] = (), *, bot_user_id: str | None
    ) -> dict[str, str]:
        """Display names of the users mentioned in `text` (the bot aside) and of `authors`
        (ids stay where a lookup fails)."""
        ids = {found for found in _MENTION.findall(text) if found != bot_user_id}
        ids.update(author for author in authors if author)
        # Looked up side by side: this runs before the acknowledgement, inside Slack's 3 s,
        # so a text with many mentions costs one lookup's time limit at most.
        wanted = sorted(ids)[:MAX_NAME_LOOKUPS]
        people = await asyncio.gather(*(self._person(user_id) for user_id in wanted))
        return {
            user_id: person.name
            for user_id, person in zip(wanted, people, strict=True)
            if person is not None
        }

    async def email_of(self, user_identifier: str) -> str | None:
        """The email address in a Slack user's profile (`TEAM:USER`), for `link_by_email`."""
        person = await self._person(user_identifier.rpartition(":")[2])
        return person.email if person is not None else None

    async def _person(self, user_id: str) -> _Person | None:
        cached = self._people.get(user_id)
        if cached is not None:
            return cached
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_SECONDS):
                answer = await self.client.users_info(user=user_id)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("slack.user_lookup_failed", slack_user=user_id, error=str(exc)[:200])
            return None
        user = answer.get("user") or {}
        profile = user.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or user.get("name")
        person = _Person(name=str(name or user_id), email=profile.get("email"))
        self._people.put(user_id, person)
        return person
