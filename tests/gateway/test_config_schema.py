"""The schema and its example: the example config runs on the embedded defaults and documents
every key; the loaded objects are frozen, strict and keep secrets out of their repr;
docs/CONFIG.md is the generated reference."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pydantic
import pytest
import yaml

from gateway.config import check_config, load_config
from gateway.settings import GatewayConfig, StrictModel

EXAMPLE = Path(__file__).parents[2] / "config" / "gateway.example.yaml"


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


def test_the_config_reference_in_docs_is_the_generated_one():
    from gateway.config_reference import reference_markdown  # noqa: PLC0415

    generated = reference_markdown()
    written = (Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md").read_text()
    assert written == generated, "run: gateway config reference > docs/CONFIG.md"
    assert "`channels.slack.signing_secret`" in generated
