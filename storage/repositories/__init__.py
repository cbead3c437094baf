"""Typed data access: every query on the ORM lives here, one module per aggregate.

`sessions` (sessions, their channels and messages), `compactions`, `summaries`, `memory`
(facts about users), `export_links`, `users` (organizations, users, channel identities),
`inbox` and `outbox` (the durable queues), `leases` (job leases), and `admin` (listings across
users, for administration, retention and the gauges); `_sql` holds what they share. Import each
repository from its module: this package re-exports nothing.

Two kinds of data access stay beside the package, in `storage`: the turn's writes
(`storage.turn_store`, SQLAlchemy Core statements for the hot path) and the recall index
(`storage.recall_index`, search over rows that database triggers write).

Each repository wraps one `AsyncSession` (one transaction, opened by `Database.session()`), so
several repositories can take part in the same unit of work. They hold no business rules: which
session a message belongs to, when to compact or archive, is decided in `sessions/` and
`gateway/`; here is only how to read and write it.
"""
