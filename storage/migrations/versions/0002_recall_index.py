"""recall index: every turn, session summary and compaction summary, searchable per user

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 03:30:00

`recall_entries` holds one row per searchable text. Triggers on the source tables write and
remove those rows, so the index is kept in step by the database whatever code writes the
sources; deleting a session or a user removes its entries (triggers, and foreign keys with
ON DELETE CASCADE as a second line). The full-text structures over `body` differ per backend:

- SQLite: an FTS5 table with `recall_entries` as external content (porter stemming), kept in
  step by triggers on `recall_entries`; ranked with FTS5's `bm25()`.
- PostgreSQL: a stored generated `tsvector` column (english configuration) with a GIN index,
  and `recall_stats` (documents and total length per user and kind, kept by statement-level
  triggers) for per-user BM25.

Existing rows are indexed by this migration.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ENTRY_COLUMNS = (
    "user_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body"
)

# --- SQLite ---------------------------------------------------------------------------------

SQLITE_SPEAKER = """substr(coalesce(
    nullif(trim(CASE WHEN json_valid({m}.metadata) THEN json_extract({m}.metadata, '$.speaker')
                END), ''),
    CASE WHEN {m}.role = 'user' THEN coalesce(nullif(u.display_name, ''), u.id)
         ELSE 'assistant' END), 1, 200)"""

# {m} is the source row (NEW in a trigger, `m` when indexing existing rows) and {source} the
# FROM item for it ('' in a trigger, where NEW needs none).
SQLITE_TURN_SELECT = f"""
    SELECT s.user_id, {{m}}.session_id, 'turn', {{m}}.id, {{m}}.seq, {SQLITE_SPEAKER},
           {{m}}.channel_type, {{m}}.created_at, {{m}}.content
    FROM {{source}}sessions s JOIN users u ON u.id = s.user_id
    WHERE s.id = {{m}}.session_id AND {{m}}.role IN ('user', 'assistant')
      AND trim({{m}}.content) <> ''"""  # noqa: S608

SQLITE_SUMMARY_SELECT = """
    SELECT {m}.user_id, {m}.session_id, 'summary', {m}.id, NULL, '', '', {m}.created_at,
           {m}.summary
    {from_source} WHERE trim({m}.summary) <> ''"""

SQLITE_COMPACTION_SELECT = """
    SELECT s.user_id, {m}.session_id, 'compaction', {m}.id, {m}.last_message_seq, '', '',
           {m}.created_at, {m}.summary
    FROM {source}sessions s WHERE s.id = {m}.session_id AND trim({m}.summary) <> ''"""

SQLITE_FTS_VALUES = "{r}.id, {r}.user_id, {r}.kind, {r}.body"


def _sqlite_source_triggers(
    name: str, table: str, kind: str, select: str, watched: str
) -> list[str]:
    """Insert, update and delete triggers that keep one source table's entries in step."""
    row = select.format(m="NEW", source="", from_source="")
    insert = f"INSERT INTO recall_entries ({ENTRY_COLUMNS}) {row};"
    remove = f"DELETE FROM recall_entries WHERE kind = '{kind}' AND source_id = OLD.id;"  # noqa: S608
    return [
        f"CREATE TRIGGER recall_{name}_insert AFTER INSERT ON {table} BEGIN {insert} END",
        f"CREATE TRIGGER recall_{name}_update AFTER UPDATE OF {watched} ON {table} "
        f"BEGIN {remove} {insert} END",
        f"CREATE TRIGGER recall_{name}_delete AFTER DELETE ON {table} BEGIN {remove} END",
    ]


def _upgrade_sqlite() -> None:
    op.execute(
        "CREATE VIRTUAL TABLE recall_fts USING fts5(user_id, kind, body, "
        "content='recall_entries', content_rowid='id', "
        "tokenize='porter unicode61 remove_diacritics 2')"
    )
    fts_new = SQLITE_FTS_VALUES.format(r="NEW")
    fts_old = SQLITE_FTS_VALUES.format(r="OLD")
    delete_old = (
        "INSERT INTO recall_fts(recall_fts, rowid, user_id, kind, body) "  # noqa: S608
        f"VALUES ('delete', {fts_old});"
    )
    insert_new = f"INSERT INTO recall_fts(rowid, user_id, kind, body) VALUES ({fts_new});"  # noqa: S608
    op.execute(
        f"CREATE TRIGGER recall_fts_insert AFTER INSERT ON recall_entries BEGIN {insert_new} END"
    )
    op.execute(
        f"CREATE TRIGGER recall_fts_delete AFTER DELETE ON recall_entries BEGIN {delete_old} END"
    )
    op.execute(
        "CREATE TRIGGER recall_fts_update AFTER UPDATE ON recall_entries "
        f"BEGIN {delete_old} {insert_new} END"
    )
    sources = (
        ("turn", "session_messages", "turn", SQLITE_TURN_SELECT, "content, role, metadata"),
        ("summary", "session_summaries", "summary", SQLITE_SUMMARY_SELECT, "summary"),
        ("compaction", "session_compactions", "compaction", SQLITE_COMPACTION_SELECT, "summary"),
    )
    for _name, table, _kind, select, _watched in sources:
        # Index what is already there (the FTS triggers above see these inserts).
        existing = select.format(m="m", source=f"{table} AS m, ", from_source=f"FROM {table} AS m")
        op.execute(f"INSERT INTO recall_entries ({ENTRY_COLUMNS}) {existing}")
    for name, table, kind, select, watched in sources:
        for statement in _sqlite_source_triggers(name, table, kind, select, watched):
            op.execute(statement)


# --- PostgreSQL -----------------------------------------------------------------------------

PG_SPEAKER = """left(coalesce(
    nullif(btrim({m}.metadata ->> 'speaker'), ''),
    CASE WHEN {m}.role = 'user' THEN coalesce(nullif(u.display_name, ''), u.id)
         ELSE 'assistant' END), 200)"""

PG_TURN_SELECT = f"""
    SELECT s.user_id, {{m}}.session_id, 'turn', {{m}}.id, {{m}}.seq, {PG_SPEAKER},
           {{m}}.channel_type, {{m}}.created_at, {{m}}.content
    FROM {{source}} JOIN sessions s ON s.id = {{m}}.session_id JOIN users u ON u.id = s.user_id
    WHERE {{m}}.role IN ('user', 'assistant') AND btrim({{m}}.content) <> ''"""  # noqa: S608

PG_SUMMARY_SELECT = """
    SELECT {m}.user_id, {m}.session_id, 'summary', {m}.id, NULL, '', '', {m}.created_at,
           {m}.summary
    FROM {source} WHERE btrim({m}.summary) <> ''"""

PG_COMPACTION_SELECT = """
    SELECT s.user_id, {m}.session_id, 'compaction', {m}.id, {m}.last_message_seq, '', '',
           {m}.created_at, {m}.summary
    FROM {source} JOIN sessions s ON s.id = {m}.session_id WHERE btrim({m}.summary) <> ''"""

PG_SOURCES = (
    ("turn", "session_messages", PG_TURN_SELECT, "content, role, metadata"),
    ("summary", "session_summaries", PG_SUMMARY_SELECT, "summary"),
    ("compaction", "session_compactions", PG_COMPACTION_SELECT, "summary"),
)


def _pg_source_triggers(kind: str, table: str, select: str, watched: str) -> list[str]:
    """Row triggers that index a new or changed source row; a statement trigger (with the
    deleted rows as a transition table) that removes entries in one statement, so deleting a
    session of 100,000 messages is one DELETE, not 100,000."""
    # FROM (SELECT NEW.*) AS m: the row as a one-row relation, so the SELECT reads like the
    # backfill's.
    insert = select.format(m="m", source="(SELECT NEW.*) AS m")
    return [
        f"""CREATE FUNCTION recall_index_{kind}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' THEN
                DELETE FROM recall_entries WHERE kind = '{kind}' AND source_id = OLD.id;
            END IF;
            INSERT INTO recall_entries ({ENTRY_COLUMNS}) {insert};
            RETURN NULL;
        END $$""",  # noqa: S608
        f"""CREATE FUNCTION recall_unindex_{kind}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM recall_entries e USING gone g
            WHERE e.kind = '{kind}' AND e.source_id = g.id;
            RETURN NULL;
        END $$""",  # noqa: S608
        f"CREATE TRIGGER recall_{kind}_insert AFTER INSERT ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION recall_index_{kind}()",
        f"CREATE TRIGGER recall_{kind}_update AFTER UPDATE OF {watched} ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION recall_index_{kind}()",
        f"CREATE TRIGGER recall_{kind}_delete AFTER DELETE ON {table} "
        f"REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
        f"EXECUTE FUNCTION recall_unindex_{kind}()",
    ]


def _upgrade_postgresql() -> None:
    op.execute(
        "ALTER TABLE recall_entries ADD COLUMN tsv tsvector "
        "GENERATED ALWAYS AS (to_tsvector('english'::regconfig, body)) STORED"
    )
    op.execute("CREATE INDEX recall_entries_tsv ON recall_entries USING gin (tsv)")
    op.execute(
        """CREATE TABLE recall_stats (
            user_id varchar(64) NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            kind varchar(10) NOT NULL,
            documents bigint NOT NULL,
            total_length bigint NOT NULL,
            PRIMARY KEY (user_id, kind)
        )"""
    )
    # BM25 needs the number of documents and their average length per user; counted here
    # once per statement instead of scanning the user's entries on every search.
    op.execute(
        """CREATE FUNCTION recall_count_entries() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO recall_stats AS s (user_id, kind, documents, total_length)
            SELECT user_id, kind, count(*), coalesce(sum(length(tsv)), 0)
            FROM added GROUP BY user_id, kind
            ON CONFLICT (user_id, kind) DO UPDATE
            SET documents = s.documents + EXCLUDED.documents,
                total_length = s.total_length + EXCLUDED.total_length;
            RETURN NULL;
        END $$"""
    )
    op.execute(
        """CREATE FUNCTION recall_uncount_entries() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE recall_stats s
            SET documents = s.documents - g.documents,
                total_length = s.total_length - g.total_length
            FROM (SELECT user_id, kind, count(*) AS documents,
                         coalesce(sum(length(tsv)), 0) AS total_length
                  FROM gone GROUP BY user_id, kind) g
            WHERE s.user_id = g.user_id AND s.kind = g.kind;
            RETURN NULL;
        END $$"""
    )
    op.execute(
        "CREATE TRIGGER recall_entries_counted AFTER INSERT ON recall_entries "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT "
        "EXECUTE FUNCTION recall_count_entries()"
    )
    op.execute(
        "CREATE TRIGGER recall_entries_uncounted AFTER DELETE ON recall_entries "
        "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
        "EXECUTE FUNCTION recall_uncount_entries()"
    )
    for kind, table, select, watched in PG_SOURCES:
        op.execute(
            f"INSERT INTO recall_entries ({ENTRY_COLUMNS}) " + select.format(m=table, source=table)
        )
        for statement in _pg_source_triggers(kind, table, select, watched):
            op.execute(statement)


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "recall_entries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("source_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.Column("speaker", sa.String(length=200), nullable=False),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_recall_entries_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_recall_entries_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recall_entries")),
        sa.UniqueConstraint("kind", "source_id", name=op.f("uq_recall_entries_kind")),
    )
    op.create_index(
        "ix_recall_entries_session_seq", "recall_entries", ["session_id", "seq"], unique=False
    )
    op.create_index(
        "ix_recall_entries_user_kind", "recall_entries", ["user_id", "kind"], unique=False
    )
    if op.get_bind().dialect.name == "sqlite":
        _upgrade_sqlite()
    else:
        _upgrade_postgresql()


def downgrade() -> None:
    """Revert this revision."""
    if op.get_bind().dialect.name == "sqlite":
        for name in ("turn", "summary", "compaction"):
            for event in ("insert", "update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS recall_{name}_{event}")
        op.execute("DROP TABLE IF EXISTS recall_fts")
    else:
        for kind, table, _select, _watched in PG_SOURCES:
            for event in ("insert", "update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS recall_{kind}_{event} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS recall_index_{kind}()")
            op.execute(f"DROP FUNCTION IF EXISTS recall_unindex_{kind}()")
        op.execute("DROP TABLE IF EXISTS recall_stats")
    op.drop_table("recall_entries")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS recall_count_entries()")
        op.execute("DROP FUNCTION IF EXISTS recall_uncount_entries()")
