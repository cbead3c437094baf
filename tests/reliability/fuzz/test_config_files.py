"""Fuzzing config files: `check_config` and `gateway config check` report the problems of any
file without raising, hanging or exiting otherwise than 0 or 2."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cli import main as gateway_cli
from gateway.config import check_config
from gateway.settings import parse_duration
from tests.reliability.fuzz.harness import (
    FUZZ,
    known_bug,
    tolerated,
)
from tests.reliability.fuzz.strategies import (
    key_paths,
    mutated,
)

# A failing example is printed in full, however large (a warning would hide the failure).
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_CONFIG = yaml.safe_load((REPO / "config" / "gateway.example.yaml").read_text())
DURATION_KEYS = {
    ("llm", "timeout"),
    ("llm", "offline_latency"),
    ("sessions", "archive_after"),
    ("sessions", "suggest_new_after"),
}
config_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(
        [
            # durations
            "0s",
            "-5m",
            "5x",
            "1h30",
            "24 h",
            "1e3",
            "P1D",
            "500ms",
            "1h30m",
            "9" * 30,
            "99999999999999999999d",
            10**17,
            1e308,
            # ports
            0,
            -1,
            65536,
            "8080",
            "http",
            3.5,
            # enums and other strings
            "JSON",
            "verbose",
            "on",
            "off",
            "s3 ",
            "aws:kms",
            "anthropic",
            "provision",
            "socket",
            "trusted_mta",
            "0.0.0.0",
            "mysql://root@db/x",
            "${FUZZ_UNSET_VARIABLE}",
            "${FUZZ_UNSET_VARIABLE:-fallback}",
            "${broken",
            "$${literal}",
            "not an id!",
            "T0001",
        ]
    ),
)
config_keys = st.one_of(
    st.sampled_from(sorted({str(p[-1]) for p in key_paths(EXAMPLE_CONFIG) if p})),
    st.sampled_from(["archive_afterr", "prot", "unknown", "<<", "enabled ", "80", "on", "~"]),
    st.text(max_size=10),
)


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """The example config with keys dropped, values of the wrong type, unknown keys, bad
    durations, ports and enums; then maybe textual damage (cut short, a stray line, a tab, a
    reference to an unset variable, a control character)."""
    data = draw(mutated(EXAMPLE_CONFIG, config_junk, config_keys))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        damage = draw(
            st.sampled_from(["cut", "line", "tab", "reference", "control", "indent", "alias"])
        )
        if damage == "cut":
            text = text[:at]
        elif damage == "line":
            text = text[:at] + "\n" + draw(st.text(max_size=20)) + "\n" + text[at:]
        elif damage == "tab":
            text = text[:at] + "\t" + text[at:]
        elif damage == "reference":
            text = (
                text[:at] + "${FUZZ_UNSET_" + draw(st.sampled_from(["X}", "", "X:-y}"])) + text[at:]
            )
        elif damage == "control":
            text = text[:at] + draw(st.sampled_from(["\x00", "\x01", "\x7f", "\ufffe"])) + text[at:]
        elif damage == "indent":
            text = text.replace("\n  ", "\n   ", 1)
        else:
            text += "\nanchors: &a [x, y]\nagain: [*a, *a, *a]\n"
    return text


config_files = st.one_of(
    config_texts(),
    config_texts(),
    config_texts(),
    st.text(max_size=200),
    st.sampled_from(["", "---", "--- []", "null", "42", "- a\n- b", "{", "a: b: c", "? x"]),
)

_YAML_FORBIDDEN = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


def config_known_bug(text: str) -> str | None:
    """The known bug class a config text belongs to, if any."""
    if _YAML_FORBIDDEN.search(text):
        return "config-control-characters"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    except RecursionError:
        return "config-deep-nesting"
    sections = data if isinstance(data, dict) else {}
    for section, key in DURATION_KEYS:
        values = sections.get(section)
        if not isinstance(values, dict) or values.get(key) is None:
            continue
        try:
            parse_duration(values[key])
        except OverflowError:
            return "config-duration-overflow"
        except Exception:
            continue  # any other failure is an ordinary validation problem
    return None


def test_check_config_reports_problems_of_any_file_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=400)
    @given(text=config_files)
    def example(text: str) -> None:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        started = time.monotonic()
        try:
            problems = check_config(path, {})
        except Exception:
            if tolerated(config_known_bug(text)):
                seen[f"known bug {config_known_bug(text)}"] += 1
                return
            raise
        seen["valid" if not problems else "problems"] += 1
        assert time.monotonic() - started < 5.0
        for problem in problems:
            assert problem.file == str(path)
            assert problem.message.strip()
            assert str(problem).startswith(str(path))

    example()
    assert {"valid", "problems"} <= set(seen), seen


def test_config_check_command_exits_0_or_2_for_any_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.yaml"
    codes: Counter[int] = Counter()

    @settings(FUZZ, max_examples=200)
    @given(text=config_files)
    def example(text: str) -> None:
        if tolerated(config_known_bug(text)):
            return
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        code = gateway_cli(["config", "check", str(path)])
        printed = capsys.readouterr()
        codes[code] += 1
        assert code in (0, 2), printed
        lines = printed.out.splitlines()
        assert lines, printed
        if code == 0:
            assert lines == ["ok"]
        else:
            assert all(line.strip() for line in lines), printed

    example()
    assert set(codes) == {0, 2}, codes


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "[" * 5_000 + "]" * 5_000, id="deep-flow", marks=known_bug("config-deep-nesting")
        ),
        pytest.param(
            "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 3_000)),
            id="deep-block",
            marks=known_bug("config-deep-nesting"),
        ),
        pytest.param(
            "sessions:\n  archive_after: 99999999999999999999d\n",
            id="duration-overflow",
            marks=known_bug("config-duration-overflow"),
        ),
        pytest.param(
            "llm:\n  timeout: 100000000000000000\n",
            id="duration-seconds-overflow",
            marks=known_bug("config-duration-overflow"),
        ),
        pytest.param(
            "server:\n  host: \x00\n",
            id="nul-character",
            marks=known_bug("config-control-characters"),
        ),
        pytest.param("server:\n  port: 99999\n", id="bad-port"),
    ],
)
def test_check_config_turns_hostile_files_into_problems(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    problems = check_config(path, {})
    assert problems
    assert all(str(problem).startswith(str(path)) for problem in problems)


def _alias_bomb(levels: int) -> str:
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "levels",
    [pytest.param(2, id="2-levels"), pytest.param(7, marks=known_bug("config-alias-bomb"))],
)
def test_check_config_of_an_alias_bomb_finishes_quickly(tmp_path: Path, levels: int) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels))  # 9**levels references in a few hundred bytes
    # The child times check_config alone: starting Python and importing the gateway take
    # seconds of their own when other tests keep the CPU busy. The timeout only ends a hang.
    script = (
        "import sys, time; from gateway.config import check_config; started = time.monotonic(); "
        "check_config(sys.argv[1], {}); print(time.monotonic() - started)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            cwd=REPO,
            timeout=60,
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"check_config of a {len(path.read_text())}-byte file hung")
    took = float(done.stdout)
    assert took < 3, f"check_config of a {len(path.read_text())}-byte file took {took:.1f} s"
