"""SQLAlchemy models for the whole domain, one module per concern: `base` (the declarative
base), `people`, `sessions`, `delivery` (the durable inbox and outbox), `recall` and `jobs`.

One table per concept: organizations and their users, the users' channel identities, sessions
and the channels/threads they span, the session transcript (messages), compactions, archived
session summaries, memory facts, the durable inbox and outbox, and leases for leader-elected
background jobs. The schema runs unchanged on SQLite and PostgreSQL; migrations in
`storage/migrations` create exactly these tables (a test compares the two). Importing this
package registers every table on `Base.metadata`.
"""

from storage.models.base import NAMING_CONVENTION, Base
from storage.models.delivery import InboundEvent, InboundStatus, OutboundMessage, OutboundStatus
from storage.models.jobs import JobLease
from storage.models.people import Organization, User, UserChannelIdentity, UserMemoryFact
from storage.models.recall import RecallEntry, RecallVector
from storage.models.sessions import (
    ExportLink,
    Session,
    SessionChannel,
    SessionCompaction,
    SessionMessage,
    SessionStatus,
    SessionSummary,
    ToolConfirmation,
)

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "ExportLink",
    "InboundEvent",
    "InboundStatus",
    "JobLease",
    "Organization",
    "OutboundMessage",
    "OutboundStatus",
    "RecallEntry",
    "RecallVector",
    "Session",
    "SessionChannel",
    "SessionCompaction",
    "SessionMessage",
    "SessionStatus",
    "SessionSummary",
    "ToolConfirmation",
    "User",
    "UserChannelIdentity",
    "UserMemoryFact",
]
