"""What the config refuses (fail closed), each refusal naming its key: channels without their
credentials, storage and model settings that cannot work, identities that clash."""

from __future__ import annotations

import pytest

from errors import ConfigError
from gateway.config import check_config, load_config
from tests.gateway.config_problems import problem_lines

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
