"""Loading a config file (`gateway.config` over the `gateway.settings` schema): every problem
reported at once with its file, line and key path; environment variables; durations; files that
cannot be read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic_core import PydanticCustomError

from errors import ConfigError, GatewayError
from gateway.config import ConfigProblem, check_config, load_config
from gateway.settings import parse_duration
from tests.gateway.config_problems import problem_lines

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
