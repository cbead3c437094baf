"""Behaviour of config loading and checking: `gateway.config` over the `gateway.settings` schema."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pydantic
import pytest
import yaml
from pydantic_core import PydanticCustomError

from errors import ConfigError, GatewayError
from gateway.config import ConfigProblem, check_config, load_config
from gateway.settings import GatewayConfig, StrictModel, parse_duration

EXAMPLE = Path(__file__).parents[2] / "config" / "gateway.example.yaml"


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a dedented YAML text to a file and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "gateway.yaml"
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write


def problem_lines(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    return [str(problem) for problem in check_config(path, environ or {})]


# --- the example and the defaults -----------------------------------------------------------


def test_example_config_passes_with_an_empty_environment():
    assert check_config(EXAMPLE, {}) == []
    config = load_config(EXAMPLE, {})
    assert config.organizations[0].id == "acme"
    assert config.identity.users[0].id == "alice"
    assert config.identity.users[0].slack == ("T0001:U0001",)


def test_example_config_runs_on_the_embedded_defaults():
    example = load_config(EXAMPLE, {})
    defaults = GatewayConfig()
    for section in ("server", "logging", "storage", "llm", "sessions"):
        assert getattr(example, section) == getattr(defaults, section), section
    assert example.channels.web == defaults.channels.web
    assert example.channels.slack == defaults.channels.slack
    assert example.channels.teams == defaults.channels.teams
    # The differences: `make run` listens for email on a local port and writes its replies
    # to a folder instead of an SMTP relay.
    assert example.channels.email.enabled is True
    assert example.channels.email.listen_host == "127.0.0.1"
    assert example.channels.email.outbound.mode == "files"
    assert defaults.channels.email.outbound.mode == "smtp"


def test_example_config_takes_the_anthropic_key_from_the_environment():
    config = load_config(EXAMPLE, {"ANTHROPIC_API_KEY": "sk-test"})
    assert config.llm.api_key.get_secret_value() == "sk-test"


def schema_key_paths(model: type[pydantic.BaseModel], prefix: tuple[str, ...] = ()):
    """Every key path of the schema; list items contribute the keys of their item model."""
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        yield path
        nested = [
            arg
            for arg in (info.annotation, *getattr(info.annotation, "__args__", ()))
            if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel)
        ]
        if nested:
            yield from schema_key_paths(nested[0], path)


def example_key_paths() -> set[tuple[str, ...]]:
    """Every key path written in the example, list indexes left out."""
    found: set[tuple[str, ...]] = set()

    def walk(node: object, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                found.add((*path, key))
                walk(value, (*path, key))
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    walk(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")), ())
    return found


def test_example_config_lists_every_key_of_the_schema():
    text = EXAMPLE.read_text(encoding="utf-8")
    # Keys of list items that the example leaves empty are shown in a comment instead.
    missing = {
        path
        for path in set(schema_key_paths(GatewayConfig)) - example_key_paths()
        if f"{path[-1]}:" not in text
    }
    assert not missing, sorted(missing)


def test_every_key_in_the_example_has_a_comment():
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    undocumented = []
    for number, line in enumerate(lines):
        stripped = line.strip().removeprefix("- ")
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        previous = lines[number - 1].strip() if number else ""
        if "#" not in line and not previous.startswith("#"):
            undocumented.append(f"{number + 1}: {line}")
    assert not undocumented, undocumented


def test_no_file_gives_the_embedded_defaults():
    config = load_config(None)
    assert config == GatewayConfig()
    assert config.server.port == 8080
    assert config.storage.database_url == "sqlite+aiosqlite:///./var/gateway.db"
    assert config.storage.transcripts.backend == "local"
    assert config.llm.provider == "auto"
    assert config.channels.web.enabled is True
    assert config.channels.web.dev_open is True
    assert config.sessions.archive_after == timedelta(hours=24)


def test_an_empty_file_gives_the_embedded_defaults(write_config):
    path = write_config("# only a comment\n")
    assert load_config(path, {}) == GatewayConfig()


# --- reporting: all problems, located -------------------------------------------------------


def test_typo_and_wrong_type_are_both_reported_with_their_lines(write_config):
    path = write_config(
        """
        server:
          host: 0.0.0.0
          port: eighty
        sessions:
          scope: user
          archive_aftr: 24h
        sesions:
          archive_after: 1h
        """
    )
    problems = check_config(path, {})
    assert [(p.line, p.key_path) for p in problems] == [
        (3, "server.port"),
        (6, "sessions.archive_aftr"),
        (7, "sesions"),
    ]
    lines = [str(problem) for problem in problems]
    assert lines[0].startswith(f"{path}:3: server.port: Input should be a valid integer")
    assert (
        lines[1] == f"{path}:6: sessions.archive_aftr: unknown key (did you mean 'archive_after'?)"
    )
    assert lines[2] == f"{path}:7: sesions: unknown key (did you mean 'sessions'?)"


def test_load_config_raises_config_error_with_every_problem(write_config):
    path = write_config(
        """
        server: {port: eighty}
        logging: {level: loud}
        """
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path, {})
    assert isinstance(raised.value, GatewayError)
    assert len(raised.value.problems) == 2
    assert str(raised.value) == "\n".join(raised.value.problems)
    assert raised.value.problems[1].startswith(f"{path}:2: logging.level: Input should be 'debug'")


def test_turn_workers_are_refused_on_sqlite(write_config):
    path = write_config(
        """
        server:
          turn_workers: 2
        """
    )
    (problem,) = problem_lines(path)
    assert "storage.database_url" in problem
    assert "turn_workers needs PostgreSQL" in problem


def test_problem_in_a_list_item_names_its_index_and_line(write_config):
    path = write_config(
        """
        identity:
          users:
            - id: alice
            - id: bob
              slak: ["T1:U1"]
        """
    )
    assert problem_lines(path) == [
        f"{path}:5: identity.users[1].slak: unknown key (did you mean 'slack'?)",
    ]


def test_unknown_key_without_a_close_match_lists_the_allowed_keys(write_config):
    path = write_config("server: {colour: blue}\n")
    assert problem_lines(path) == [
        f"{path}:1: server.colour: unknown key (allowed: host, port, public_url, turn_workers)"
    ]


def test_problem_without_a_line_prints_file_and_key_path():
    problem = ConfigProblem(file="g.yaml", line=None, key_path="server.port", message="bad")
    assert str(problem) == "g.yaml: server.port: bad"
    assert str(ConfigProblem("g.yaml", 4, "server.port", "bad")) == "g.yaml:4: server.port: bad"


def test_a_key_given_twice_is_reported(write_config):
    path = write_config(
        """
        server:
          port: 1
          port: 2
        """
    )
    assert problem_lines(path) == [
        f"{path}:3: server.port: duplicate key 'port' (first at line 2)",
    ]


def test_merge_keys_may_be_overridden(write_config):
    path = write_config(
        """
        organizations:
          - &defaults {id: acme, context: "shared"}
          - {<<: *defaults, id: globex}
        """
    )
    config = load_config(path, {})
    assert [org.id for org in config.organizations] == ["acme", "globex"]
    assert config.organizations[1].context == "shared"


# --- environment variables ------------------------------------------------------------------


def test_missing_environment_variable_is_named_with_its_line(write_config):
    path = write_config(
        """
        llm:
          provider: anthropic
          api_key: "${ANTHROPIC_API_KEY}"
        """
    )
    # Only the missing variable is reported, not also "api_key is required".
    assert problem_lines(path) == [
        f"{path}:3: llm.api_key: environment variable ANTHROPIC_API_KEY is not set",
    ]
    config = load_config(path, {"ANTHROPIC_API_KEY": "sk-1"})
    assert config.llm.api_key.get_secret_value() == "sk-1"


def test_optional_variable_uses_its_default_or_the_environment(write_config):
    path = write_config(
        """
        server:
          host: "${HOST:-0.0.0.0}"
          port: ${PORT:-9000}
        channels:
          web: {enabled: false}
        llm:
          model: "claude-${MODEL:-haiku}-x"
          base_url: "${BASE_URL:-}"
        """
    )
    config = load_config(path, {})
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 9000
    assert config.llm.model == "claude-haiku-x"
    assert config.llm.base_url is None
    assert load_config(path, {"PORT": "9100"}).server.port == 9100


def test_double_dollar_escapes_a_literal_reference(write_config):
    path = write_config('llm: {system_prompt: "say $${NAME} and ${WHO:-you}"}\n')
    assert load_config(path, {"NAME": "no"}).llm.system_prompt == "say ${NAME} and you"


def test_malformed_reference_is_reported(write_config):
    path = write_config('llm: {model: "${1BAD}"}\n')
    [problem] = check_config(path, {})
    assert (problem.line, problem.key_path) == (1, "llm.model")
    assert "malformed reference" in problem.message


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", timedelta(hours=24)),
        ("30m", timedelta(minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("7d", timedelta(days=7)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        (45, timedelta(seconds=45)),
        (1.5, timedelta(seconds=1.5)),
        ("120", timedelta(seconds=120)),
    ],
)
def test_durations_parse(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["5x", "h", "1h 30", "-5m", "0s", "", True])
def test_bad_durations_fail(text):
    with pytest.raises(PydanticCustomError, match="invalid duration"):
        parse_duration(text)


def test_bad_duration_in_a_file_says_what_a_duration_looks_like(write_config):
    path = write_config(
        """
        sessions:
          archive_after: 1h30m
          suggest_new_after: 5x
        """
    )
    assert problem_lines(path) == [
        f"{path}:3: sessions.suggest_new_after: invalid duration '5x': "
        "use a number with s, m, h or d, e.g. 30m",
    ]


# --- fail-closed rules ----------------------------------------------------------------------


def test_slack_enabled_without_signing_secret_is_refused(write_config):
    path = write_config(
        """
        channels:
          slack:
            enabled: true
            bot_token: xoxb-1
        """
    )
    [problem] = check_config(path, {})
    assert problem.key_path == "channels.slack.signing_secret"
    assert problem.line == 2
    with pytest.raises(ConfigError, match=r"channels\.slack\.signing_secret"):
        load_config(path, {})


def test_slack_socket_mode_needs_an_app_token_not_a_signing_secret(write_config):
    path = write_config("channels: {slack: {enabled: true, mode: socket, bot_token: b}}\n")
    assert [p.key_path for p in check_config(path, {})] == ["channels.slack.app_token"]


def test_teams_enabled_without_app_id_is_refused_unless_insecure_dev_mode(write_config):
    path = write_config("channels: {teams: {enabled: true}}\n")
    assert [p.key_path for p in check_config(path, {})] == [
        "channels.teams.app_id",
        "channels.teams.app_password",
    ]
    dev = write_config("channels: {teams: {enabled: true, insecure_dev_mode: true}}\n")
    assert load_config(dev, {}).channels.teams.insecure_dev_mode is True


def test_s3_backend_without_bucket_is_refused(write_config):
    path = write_config(
        """
        storage:
          transcripts:
            backend: s3
            s3:
              region: eu-west-1
        """
    )
    assert problem_lines(path) == [
        f"{path}:4: storage.transcripts.s3.bucket: required when storage.transcripts.backend is s3",
    ]
    ok = write_config("storage: {transcripts: {backend: s3, s3: {bucket: b, sse: 'aws:kms'}}}\n")
    assert load_config(ok, {}).storage.transcripts.s3.bucket == "b"


def test_kms_key_only_with_kms_encryption(write_config):
    path = write_config("storage: {transcripts: {s3: {sse: AES256, kms_key_id: k}}}\n")
    assert [p.key_path for p in check_config(path, {})] == ["storage.transcripts.s3.kms_key_id"]


def test_database_url_needs_an_async_driver(write_config):
    path = write_config("storage: {database_url: 'postgresql://db/gw'}\n")
    assert [p.key_path for p in check_config(path, {})] == ["storage.database_url"]


def test_anthropic_provider_needs_an_api_key(write_config):
    path = write_config('llm: {provider: anthropic, api_key: "${ANTHROPIC_API_KEY:-}"}\n')
    assert [p.key_path for p in check_config(path, {})] == ["llm.api_key"]


def test_compaction_keeps_fewer_messages_than_it_allows(write_config):
    path = write_config("sessions: {compaction: {max_messages: 20, keep_last_messages: 20}}\n")
    assert [p.key_path for p in check_config(path, {})] == [
        "sessions.compaction.keep_last_messages"
    ]


def test_closed_web_channel_needs_tokens_for_configured_users(write_config):
    no_tokens = write_config("channels: {web: {dev_open: false}}\n")
    assert [p.key_path for p in check_config(no_tokens, {})] == ["channels.web.tokens"]
    unknown_user = write_config(
        """
        identity:
          users: [{id: alice}]
        channels:
          web:
            dev_open: false
            tokens:
              - {token: "${WEB_TOKEN}", user: bob}
        """
    )
    assert problem_lines(unknown_user, {"WEB_TOKEN": "t"}) == [
        f"{unknown_user}:7: channels.web.tokens[0].user: unknown user 'bob'",
    ]


def test_email_auth_accepts_a_bare_off(write_config):
    path = write_config("channels: {email: {auth: {mode: off}}}\n")
    assert load_config(path, {}).channels.email.auth.mode == "off"


def test_trusted_mta_needs_an_authserv_id(write_config):
    path = write_config("channels: {email: {auth: {mode: trusted_mta}}}\n")
    assert [p.key_path for p in check_config(path, {})] == [
        "channels.email.auth.trusted_authserv_id"
    ]


def test_port_out_of_range_is_refused(write_config):
    path = write_config("server: {port: 70000}\n")
    assert [p.key_path for p in check_config(path, {})] == ["server.port"]


# --- identities -----------------------------------------------------------------------------


def test_duplicate_user_ids_are_refused(write_config):
    path = write_config(
        """
        identity:
          users:
            - id: alice
            - id: bob
            - id: alice
        """
    )
    assert problem_lines(path) == [
        f"{path}:5: identity.users[2].id: duplicate user id 'alice' (also users[0])",
    ]


def test_duplicate_organization_ids_are_refused(write_config):
    path = write_config("organizations: [{id: acme}, {id: acme}]\n")
    assert [p.key_path for p in check_config(path, {})] == ["organizations[1].id"]


def test_one_identity_cannot_belong_to_two_users(write_config):
    path = write_config(
        """
        identity:
          users:
            - {id: alice, email: [alice@acme.example]}
            - {id: bob, email: [Alice@Acme.example]}
        """
    )
    assert [p.key_path for p in check_config(path, {})] == ["identity.users[1].email[0]"]


def test_users_must_belong_to_a_configured_organization(write_config):
    path = write_config(
        """
        organizations: [{id: acme}]
        identity:
          users:
            - {id: alice, org: acme}
            - {id: bob, org: globex}
            - {id: carol}
        """
    )
    assert [(p.line, p.key_path) for p in check_config(path, {})] == [
        (5, "identity.users[1].org"),
        (6, "identity.users[2].org"),
    ]


def test_slack_identities_look_like_team_and_user(write_config):
    path = write_config('identity: {users: [{id: alice, slack: ["U0001"]}]}\n')
    [problem] = check_config(path, {})
    assert problem.key_path == "identity.users[0].slack[0]"
    assert "TEAM:USER" in problem.message


def test_ids_must_be_safe_path_segments(write_config):
    path = write_config('identity: {users: [{id: "../etc"}]}\n')
    assert [p.key_path for p in check_config(path, {})] == ["identity.users[0].id"]


# --- unreadable files -----------------------------------------------------------------------


def test_malformed_yaml_reports_its_line(write_config):
    path = write_config(
        """
        server:
          host: 127.0.0.1
            port: 8080
        """
    )
    [problem] = check_config(path, {})
    assert problem.line == 3
    assert problem.message.startswith("invalid YAML: ")
    assert str(problem).startswith(f"{path}:3: invalid YAML: ")


def test_top_level_that_is_not_a_mapping_is_one_problem(write_config):
    path = write_config("- server\n- storage\n")
    [problem] = check_config(path, {})
    assert "top level must be a mapping" in problem.message


def test_missing_file_is_one_problem(tmp_path):
    path = tmp_path / "absent.yaml"
    assert problem_lines(path) == [f"{path}: cannot read file: No such file or directory"]
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(path, {})


def test_bad_explicit_tag_is_a_problem_not_a_traceback(write_config):
    path = write_config("server: {port: !!int eighty}\n")
    [problem] = check_config(path, {})
    assert problem.key_path == "server.port"


def test_unsafe_tags_are_refused(write_config):
    path = write_config("server: {host: !!python/name:os.system x}\n")
    [problem] = check_config(path, {})
    assert problem.message.startswith("invalid YAML: ")


# --- the loaded objects ---------------------------------------------------------------------


def test_secrets_are_secret_strings_that_never_print(write_config):
    path = write_config(
        """
        llm: {api_key: "${ANTHROPIC_API_KEY}"}
        identity: {users: [{id: alice}]}
        channels:
          web: {tokens: [{token: web-secret-1, user: alice}]}
          slack: {bot_token: xoxb-secret-2, signing_secret: slack-secret-3, app_token: xapp-4}
          teams: {app_password: teams-secret-5}
          email: {outbound: {password: smtp-secret-6}}
        """
    )
    config = load_config(path, {"ANTHROPIC_API_KEY": "sk-secret-0"})
    secrets = [
        config.llm.api_key,
        config.channels.web.tokens[0].token,
        config.channels.slack.bot_token,
        config.channels.slack.signing_secret,
        config.channels.slack.app_token,
        config.channels.teams.app_password,
        config.channels.email.outbound.password,
    ]
    assert all(isinstance(secret, pydantic.SecretStr) for secret in secrets)
    printed = repr(config) + str(config)
    for secret in secrets:
        assert secret.get_secret_value() not in printed


def test_config_objects_are_frozen():
    config = GatewayConfig()
    with pytest.raises(pydantic.ValidationError):
        config.server.port = 1  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        config.sessions = config.sessions  # type: ignore[misc]
    assert isinstance(config.identity.users, tuple)


def test_every_config_model_is_strict():
    def models(model: type[pydantic.BaseModel]):
        yield model
        for info in model.model_fields.values():
            for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
                if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel):
                    yield from models(arg)

    for model in models(GatewayConfig):
        assert issubclass(model, StrictModel), model
        assert model.model_config.get("frozen") is True
        assert model.model_config.get("extra") == "forbid"


def test_dev_open_web_channel_refuses_a_non_loopback_host(write_config):
    path = write_config(
        """
        server: {host: 0.0.0.0}
        channels:
          web: {dev_open: true}
        """
    )
    (problem,) = check_config(path, {})
    assert problem.key_path == "channels.web.dev_open"
    assert "loopback" in problem.message


def test_the_config_reference_in_docs_is_the_generated_one():
    from gateway.config_reference import reference_markdown  # noqa: PLC0415

    generated = reference_markdown()
    written = (Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md").read_text()
    assert written == generated, "run: gateway config reference > docs/CONFIG.md"
    assert "`channels.slack.signing_secret`" in generated
