"""Job leases: which process runs a background job."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import JobLease
from storage.repositories._sql import dialect_insert


class LeaseRepository:
    """Leases that elect one process to run a background job."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def try_acquire(self, name: str, holder: str, *, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the lease `name` for `holder`; False while another holder's is valid."""
        statement = dialect_insert(self.session, JobLease).values(
            name=name, holder=holder, expires_at=now + ttl
        )
        statement = statement.on_conflict_do_update(
            index_elements=[JobLease.name],
            set_={"holder": holder, "expires_at": now + ttl},
            where=(JobLease.expires_at < now) | (JobLease.holder == holder),
        ).returning(JobLease.holder)
        result = await self.session.execute(statement)
        return result.scalar_one_or_none() == holder

    async def release(self, name: str, holder: str) -> None:
        """Give the lease up early (at shutdown) so another process takes over at once."""
        await self.session.execute(
            delete(JobLease).where(JobLease.name == name, JobLease.holder == holder)
        )
