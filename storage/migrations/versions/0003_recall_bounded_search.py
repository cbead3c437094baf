"""recall index: what a search bounded by the user's recent history needs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 09:00:00

The recall search examines a bounded share of a user's index whatever the length of their
history (`storage/recall_index.py`): the user's most recent entries, and the whole history
only for the words the user has used rarely. This revision adds what that needs:

- `ix_recall_entries_user_kind_occurred_at` (replacing `ix_recall_entries_user_kind`): a
  user's most recent entries of a kind are one backward index range scan.
- `recall_stats` on both backends, one row per user and kind with `term` '' (the number of
  entries and their total length, for BM25); SQLite gets the table and row triggers on
  `recall_entries` (the length is counted in characters there). PostgreSQL also counts, per
  user, kind and lexeme, the entries that contain the lexeme (`term` = the lexeme), so a
  search knows how rare each word is before it reads any posting.
- PostgreSQL: `recall_entries_tsv` becomes a GIN index over each user's own lexemes per kind
  (`recall_user_lexemes(user_id, kind, tsv)`: each lexeme, a space, the kind, a space, the
  user id), so looking up a word for one user's turns (or summaries) reads those postings
  only, not every user's, nor the turns' when summaries are searched.
- PostgreSQL: new turns, summaries and compactions are indexed once per INSERT statement (a
  statement trigger reading the inserted rows) instead of once per row, so the statistics are
  counted once per statement: a row updated again and again in one transaction gets slower
  with every version it leaves behind, which made loading many rows in one transaction
  quadratic. Changed rows are still indexed row by row (revision 0002's functions).

Existing entries are counted by this migration.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_INDEX = "ix_recall_entries_user_kind"
NEW_INDEX = "ix_recall_entries_user_kind_occurred_at"

# --- SQLite ---------------------------------------------------------------------------------

SQLITE_COUNT = """INSERT INTO recall_stats (user_id, kind, term, documents, total_length)
    VALUES (NEW.user_id, NEW.kind, '', 1, length(NEW.body))
    ON CONFLICT (user_id, kind, term) DO UPDATE
    SET documents = documents + 1, total_length = total_length + excluded.total_length;"""

SQLITE_UNCOUNT = """UPDATE recall_stats
    SET documents = documents - 1, total_length = total_length - length(OLD.body)
    WHERE user_id = OLD.user_id AND kind = OLD.kind AND term = '';"""


def _upgrade_sqlite() -> None:
    op.execute(
        """CREATE TABLE recall_stats (
            user_id VARCHAR(64) NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            kind VARCHAR(10) NOT NULL,
            term TEXT NOT NULL DEFAULT '',
            documents BIGINT NOT NULL,
            total_length BIGINT NOT NULL,
            PRIMARY KEY (user_id, kind, term)
        )"""
    )
    op.execute(
        "INSERT INTO recall_stats (user_id, kind, term, documents, total_length) "
        "SELECT user_id, kind, '', count(*), coalesce(sum(length(body)), 0) "
        "FROM recall_entries GROUP BY user_id, kind"
    )
    op.execute(
        f"CREATE TRIGGER recall_stats_insert AFTER INSERT ON recall_entries "
        f"BEGIN {SQLITE_COUNT} END"
    )
    op.execute(
        f"CREATE TRIGGER recall_stats_delete AFTER DELETE ON recall_entries "
        f"BEGIN {SQLITE_UNCOUNT} END"
    )
    op.execute(
        "CREATE TRIGGER recall_stats_update AFTER UPDATE OF user_id, kind, body "
        f"ON recall_entries BEGIN {SQLITE_UNCOUNT} {SQLITE_COUNT} END"
    )


def _downgrade_sqlite() -> None:
    for event in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS recall_stats_{event}")
    op.execute("DROP TABLE IF EXISTS recall_stats")


# --- PostgreSQL -----------------------------------------------------------------------------

# Rows of the entries in `{table}` to add to (or take from) the statistics: per user and kind
# the collection (term '') and every lexeme. Sorted, so two transactions counting the same
# user lock the statistics rows in the same order.
PG_COUNTED = """
    SELECT user_id, kind, '' AS term, count(*) AS documents,
           coalesce(sum(length(tsv)), 0) AS total_length
    FROM {table} GROUP BY user_id, kind
    UNION ALL
    SELECT user_id, kind, lexeme, count(*), 0
    FROM {table}, unnest(tsvector_to_array(tsv)) AS lexeme GROUP BY user_id, kind, lexeme"""

PG_COUNT = f"""CREATE OR REPLACE FUNCTION recall_count_entries() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO recall_stats AS s (user_id, kind, term, documents, total_length)
        SELECT * FROM ({PG_COUNTED.format(table="added")}) AS counted
        ORDER BY user_id, kind, term
        ON CONFLICT (user_id, kind, term) DO UPDATE
        SET documents = s.documents + EXCLUDED.documents,
            total_length = s.total_length + EXCLUDED.total_length;
        RETURN NULL;
    END $$"""  # noqa: S608

# A lexeme no entry of the user contains any more leaves no row behind (deleted before the
# others are decremented: one statement must not both update and delete a row); the
# collection rows stay, at zero, as before.
PG_UNCOUNT = f"""CREATE OR REPLACE FUNCTION recall_uncount_entries() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM recall_stats s USING ({PG_COUNTED.format(table="gone")}) AS g
        WHERE s.user_id = g.user_id AND s.kind = g.kind AND s.term = g.term
          AND s.term <> '' AND s.documents <= g.documents;
        UPDATE recall_stats s
        SET documents = s.documents - g.documents,
            total_length = s.total_length - g.total_length
        FROM ({PG_COUNTED.format(table="gone")}) AS g
        WHERE s.user_id = g.user_id AND s.kind = g.kind AND s.term = g.term;
        RETURN NULL;
    END $$"""  # noqa: S608

# The functions of revision 0002, restored on downgrade.
PG_COUNT_0002 = """CREATE OR REPLACE FUNCTION recall_count_entries() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO recall_stats AS s (user_id, kind, documents, total_length)
        SELECT user_id, kind, count(*), coalesce(sum(length(tsv)), 0)
        FROM added GROUP BY user_id, kind
        ON CONFLICT (user_id, kind) DO UPDATE
        SET documents = s.documents + EXCLUDED.documents,
            total_length = s.total_length + EXCLUDED.total_length;
        RETURN NULL;
    END $$"""

PG_UNCOUNT_0002 = """CREATE OR REPLACE FUNCTION recall_uncount_entries() RETURNS trigger
    LANGUAGE plpgsql AS $$
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

# Lexemes and kinds never hold a space, so "lexeme kind user" names one (lexeme, kind, user)
# unambiguously.
PG_USER_LEXEMES = """CREATE FUNCTION recall_user_lexemes(user_id varchar, kind varchar, tsv tsvector)
    RETURNS text[] LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
        SELECT coalesce(array_agg(lexeme || ' ' || kind || ' ' || user_id), '{}')
        FROM unnest(tsvector_to_array(tsv)) AS lexeme
    $$"""


# The rows revision 0002 indexes, read from the statement's inserted rows (`added`).
PG_SPEAKER = """left(coalesce(
    nullif(btrim(m.metadata ->> 'speaker'), ''),
    CASE WHEN m.role = 'user' THEN coalesce(nullif(u.display_name, ''), u.id)
         ELSE 'assistant' END), 200)"""

PG_ADDED = {
    "turn": f"""
        SELECT s.user_id, m.session_id, 'turn', m.id, m.seq, {PG_SPEAKER}, m.channel_type,
               m.created_at, m.content
        FROM added AS m JOIN sessions s ON s.id = m.session_id JOIN users u ON u.id = s.user_id
        WHERE m.role IN ('user', 'assistant') AND btrim(m.content) <> ''""",  # noqa: S608
    "summary": """
        SELECT m.user_id, m.session_id, 'summary', m.id, NULL, '', '', m.created_at, m.summary
        FROM added AS m WHERE btrim(m.summary) <> ''""",
    "compaction": """
        SELECT s.user_id, m.session_id, 'compaction', m.id, m.last_message_seq, '', '',
               m.created_at, m.summary
        FROM added AS m JOIN sessions s ON s.id = m.session_id WHERE btrim(m.summary) <> ''""",
}
PG_SOURCE_TABLES = {
    "turn": "session_messages",
    "summary": "session_summaries",
    "compaction": "session_compactions",
}
ENTRY_COLUMNS = (
    "user_id, session_id, kind, source_id, seq, speaker, channel_type, occurred_at, body"
)


def _index_per_statement() -> None:
    for kind, table in PG_SOURCE_TABLES.items():
        op.execute(
            f"""CREATE FUNCTION recall_index_added_{kind}() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO recall_entries ({ENTRY_COLUMNS}) {PG_ADDED[kind]};
                RETURN NULL;
            END $$"""
        )
        op.execute(f"DROP TRIGGER recall_{kind}_insert ON {table}")
        op.execute(
            f"CREATE TRIGGER recall_{kind}_insert AFTER INSERT ON {table} "
            f"REFERENCING NEW TABLE AS added FOR EACH STATEMENT "
            f"EXECUTE FUNCTION recall_index_added_{kind}()"
        )


def _index_per_row() -> None:
    for kind, table in PG_SOURCE_TABLES.items():
        op.execute(f"DROP TRIGGER recall_{kind}_insert ON {table}")
        op.execute(f"DROP FUNCTION recall_index_added_{kind}()")
        op.execute(
            f"CREATE TRIGGER recall_{kind}_insert AFTER INSERT ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION recall_index_{kind}()"
        )


def _upgrade_postgresql() -> None:
    op.execute("ALTER TABLE recall_stats ADD COLUMN term text NOT NULL DEFAULT ''")
    op.execute("ALTER TABLE recall_stats DROP CONSTRAINT recall_stats_pkey")
    op.execute("ALTER TABLE recall_stats ADD PRIMARY KEY (user_id, kind, term)")
    # Every turn updates the rows of its lexemes: room on the page keeps those updates HOT.
    op.execute("ALTER TABLE recall_stats SET (fillfactor = 70)")
    op.execute(
        "INSERT INTO recall_stats (user_id, kind, term, documents, total_length) "
        "SELECT user_id, kind, lexeme, count(*), 0 "
        "FROM recall_entries, unnest(tsvector_to_array(tsv)) AS lexeme "
        "GROUP BY user_id, kind, lexeme"
    )
    op.execute(PG_COUNT)
    op.execute(PG_UNCOUNT)
    op.execute("DROP INDEX recall_entries_tsv")
    op.execute(PG_USER_LEXEMES)
    op.execute(
        "CREATE INDEX recall_entries_tsv ON recall_entries "
        "USING gin (recall_user_lexemes(user_id, kind, tsv))"
    )
    _index_per_statement()


def _downgrade_postgresql() -> None:
    _index_per_row()
    op.execute("DROP INDEX recall_entries_tsv")
    op.execute("DROP FUNCTION recall_user_lexemes(varchar, varchar, tsvector)")
    op.execute("CREATE INDEX recall_entries_tsv ON recall_entries USING gin (tsv)")
    op.execute(PG_COUNT_0002)
    op.execute(PG_UNCOUNT_0002)
    op.execute("DELETE FROM recall_stats WHERE term <> ''")
    op.execute("ALTER TABLE recall_stats DROP CONSTRAINT recall_stats_pkey")
    op.execute("ALTER TABLE recall_stats DROP COLUMN term")
    op.execute("ALTER TABLE recall_stats ADD PRIMARY KEY (user_id, kind)")
    op.execute("ALTER TABLE recall_stats RESET (fillfactor)")


def upgrade() -> None:
    """Apply this revision."""
    op.drop_index(OLD_INDEX, table_name="recall_entries")
    op.create_index(NEW_INDEX, "recall_entries", ["user_id", "kind", "occurred_at"], unique=False)
    if op.get_bind().dialect.name == "sqlite":
        _upgrade_sqlite()
    else:
        _upgrade_postgresql()


def downgrade() -> None:
    """Revert this revision."""
    if op.get_bind().dialect.name == "sqlite":
        _downgrade_sqlite()
    else:
        _downgrade_postgresql()
    op.drop_index(NEW_INDEX, table_name="recall_entries")
    op.create_index(OLD_INDEX, "recall_entries", ["user_id", "kind"], unique=False)
