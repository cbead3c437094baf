"""`gateway doctor`: a pass/fail table of what the gateway depends on, against real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from tests.e2e.harness import free_port
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.slack_api import SIGNING_SECRET, FakeSlackAPI

EXAMPLE = Path(__file__).parents[2] / "config" / "gateway.example.yaml"


def write_config(tmp_path: Path, **sections: object) -> Path:
    path = tmp_path / "gateway.yaml"
    config = {
        "storage": {
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
            "auto_migrate": False,
            "transcripts": {"local_path": str(tmp_path / "transcripts")},
        },
        **sections,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def doctor(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, dict[str, str]]]:
    code = main(["doctor", "--config", str(path), "--json"])
    results = json.loads(capsys.readouterr().out)
    return code, {result["check"]: result for result in results}


def test_every_dependency_passes_once_the_database_is_migrated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeSlackAPI() as slack, FakeAnthropicAPI() as anthropic:
        path = write_config(
            tmp_path,
            llm={"provider": "anthropic", "api_key": "sk-test", "base_url": anthropic.url},
            channels={
                "slack": {
                    "enabled": True,
                    "bot_token": "xoxb-test",
                    "signing_secret": SIGNING_SECRET,
                    "api_base_url": slack.url,
                }
            },
        )
        before, unmigrated = doctor(path, capsys)
        assert main(["db", "upgrade", "--config", str(path)]) == 0
        capsys.readouterr()
        after, results = doctor(path, capsys)
    assert before == 1
    assert unmigrated["database"]["status"] == "fail"
    assert "gateway db upgrade" in unmigrated["database"]["detail"]
    assert after == 0
    assert {name: result["status"] for name, result in results.items()} == {
        "database": "pass",
        "transcript store": "pass",
        "smtp (outbound)": "skip",
        "slack auth.test": "pass",
        "teams token": "skip",
        "anthropic api": "pass",
    }
    assert "T0001" in results["slack auth.test"]["detail"]


def test_an_unreachable_smtp_server_fails_its_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = free_port()
    path = write_config(
        tmp_path,
        channels={"email": {"enabled": True, "outbound": {"host": "127.0.0.1", "port": closed}}},
    )
    code, results = doctor(path, capsys)
    assert code == 1
    assert results["smtp (outbound)"]["status"] == "fail"


def test_the_example_config_passes_with_replies_written_to_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the offline model, no network
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert example["channels"]["email"]["outbound"]["mode"] == "files"
    example["storage"]["database_url"] = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    example["storage"]["transcripts"]["local_path"] = str(tmp_path / "transcripts")
    example["channels"]["email"]["outbound"]["directory"] = str(tmp_path / "var" / "outbox")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(example))
    assert main(["db", "upgrade", "--config", str(path)]) == 0
    capsys.readouterr()

    code, results = doctor(path, capsys)

    assert code == 0, results
    assert results["smtp (outbound)"]["status"] == "pass"
    assert (
        results["smtp (outbound)"]["detail"] == f"writes replies to {tmp_path / 'var' / 'outbox'}"
    )
    assert list((tmp_path / "var" / "outbox").iterdir()) == []  # the probe is removed


def test_an_unwritable_reply_folder_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "outbox").write_text("a file where the folder should be")
    path = write_config(
        tmp_path,
        channels={
            "email": {
                "enabled": True,
                "outbound": {"mode": "files", "directory": str(tmp_path / "outbox")},
            }
        },
    )
    code, results = doctor(path, capsys)
    assert code == 1
    assert results["smtp (outbound)"]["status"] == "fail"
    assert "outbox" in results["smtp (outbound)"]["detail"]


def test_an_unmigrated_database_passes_when_the_gateway_migrates_it_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["storage"]["auto_migrate"] = True
    path.write_text(yaml.safe_dump(config))
    code, results = doctor(path, capsys)
    assert results["database"]["status"] == "pass"
    assert "`gateway run` migrates it" in results["database"]["detail"]
    assert code == 0
