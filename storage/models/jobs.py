"""Leases of the background jobs one elected process runs."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class JobLease(Base):
    """A lease naming the one process that runs a background job right now."""

    __tablename__ = "job_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]
