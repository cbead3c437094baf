"""The Teams app package validates against the manifest schema version it declares (1.17).

There is no network in tests, so the schema cannot be fetched: `manifest_1_17_problems` is a
hand-written subset of MicrosoftTeams.schema.json v1.17 covering every part this manifest
uses (required fields, no unknown keys, GUIDs, lengths, URL and colour patterns, bot scopes,
command lists, permissions). The icons are decoded and checked too.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from channels.teams.package import TEMPLATE_DIR, build_app_package, draw_icons
from errors import ConfigError

APP_ID = "2b7e6a0c-3f4d-4c1a-9e2b-5d6f7a8b9c0d"

# --- a hand-written subset of MicrosoftTeams.schema.json v1.17 ------------------------------

TOP_LEVEL_KEYS = {
    "$schema", "manifestVersion", "version", "id", "packageName", "localizationInfo",
    "developer", "name", "description", "icons", "accentColor", "configurableTabs",
    "staticTabs", "bots", "connectors", "subscriptionOffer", "composeExtensions", "permissions",
    "devicePermissions", "validDomains", "webApplicationInfo", "graphConnector",
    "showLoadingIndicator", "isFullScreen", "activities", "configurableProperties",
    "supportedChannelTypes", "defaultBlockUntilAdminAction", "publisherDocsUrl",
    "defaultInstallScope", "defaultGroupCapability", "meetingExtensionDefinition",
    "authorization", "extensions", "dashboardCards",
}  # fmt: skip
REQUIRED = ["manifestVersion", "version", "id", "developer", "name", "description", "icons",
            "accentColor"]  # fmt: skip
GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
HTTPS_URL = re.compile(r"^[Hh][Tt][Tt][Pp][Ss]?://")
SEMVER = re.compile(r"^([0-9]|[1-9]+[0-9]*)\.([0-9]|[1-9]+[0-9]*)\.([0-9]|[1-9]+[0-9]*)$")
HEX_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")
BOT_SCOPES = {"team", "personal", "groupChat"}
BOT_KEYS = {"botId", "configuration", "needsChannelSelector", "isNotificationOnly",
            "supportsFiles", "supportsCalling", "supportsVideo", "scopes",
            "commandLists"}  # fmt: skip


def _object(
    value: Any, path: str, *, allowed: set[str], required: set[str], problems: list[str]
) -> dict[str, Any]:
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object")
        return {}
    problems.extend(f"{path}: unknown property {key!r}" for key in sorted(set(value) - allowed))
    problems.extend(f"{path}: missing {key!r}" for key in sorted(required - set(value)))
    return value


def _string(
    value: Any, path: str, problems: list[str], *, max_length: int, pattern: re.Pattern[str] | None
) -> None:
    if value is None:
        return  # absent: reported by the parent's "required" check when it is required
    if not isinstance(value, str):
        problems.append(f"{path}: must be a string")
    elif len(value) > max_length:
        problems.append(f"{path}: longer than {max_length}")
    elif pattern is not None and not pattern.search(value):
        problems.append(f"{path}: does not match {pattern.pattern}")


def _array(value: Any, path: str, problems: list[str], *, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        problems.append(f"{path}: must be an array")
        return []
    if len(value) > max_items:
        problems.append(f"{path}: more than {max_items} items")
    return value


def manifest_1_17_problems(manifest: Any) -> list[str]:
    """Violations of the v1.17 schema rules for the parts of a manifest checked here."""
    problems: list[str] = []
    top = _object(manifest, "$", allowed=TOP_LEVEL_KEYS, required=set(REQUIRED), problems=problems)
    if top.get("manifestVersion") != "1.17":
        problems.append("manifestVersion: must be the constant '1.17'")
    if "$schema" in top and "/teams/v1.17/MicrosoftTeams.schema.json" not in top["$schema"]:
        problems.append("$schema: does not name the v1.17 schema")
    _string(top.get("version"), "version", problems, max_length=256, pattern=SEMVER)
    _string(top.get("id"), "id", problems, max_length=36, pattern=GUID)
    developer = _object(
        top.get("developer"),
        "developer",
        allowed={"name", "mpnId", "websiteUrl", "privacyUrl", "termsOfUseUrl"},
        required={"name", "websiteUrl", "privacyUrl", "termsOfUseUrl"},
        problems=problems,
    )
    _string(developer.get("name"), "developer.name", problems, max_length=32, pattern=None)
    for key in ("websiteUrl", "privacyUrl", "termsOfUseUrl"):
        _string(
            developer.get(key), f"developer.{key}", problems, max_length=2048, pattern=HTTPS_URL
        )
    for section, limits in (("name", {"short": 30, "full": 100}),
                            ("description", {"short": 80, "full": 4000})):  # fmt: skip
        values = _object(
            top.get(section), section, allowed=set(limits), required=set(limits), problems=problems
        )
        for key, limit in limits.items():
            _string(values.get(key), f"{section}.{key}", problems, max_length=limit, pattern=None)
    icons = _object(
        top.get("icons"),
        "icons",
        allowed={"outline", "color"},
        required={"outline", "color"},
        problems=problems,
    )
    for key in ("outline", "color"):
        _string(icons.get(key), f"icons.{key}", problems, max_length=2048, pattern=None)
    _string(top.get("accentColor"), "accentColor", problems, max_length=7, pattern=HEX_COLOR)
    for index, bot in enumerate(_array(top.get("bots", []), "bots", problems, max_items=1)):
        _bot_problems(bot, f"bots[{index}]", problems)
    for item in _array(top.get("permissions", []), "permissions", problems, max_items=2):
        if item not in ("identity", "messageTeamMembers"):
            problems.append(f"permissions: {item!r} is not allowed")
    for item in _array(top.get("validDomains", []), "validDomains", problems, max_items=16):
        _string(item, "validDomains[]", problems, max_length=2048, pattern=None)
    return problems


def _bot_problems(bot: Any, path: str, problems: list[str]) -> None:
    bot = _object(bot, path, allowed=BOT_KEYS, required={"botId", "scopes"}, problems=problems)
    _string(bot.get("botId"), f"{path}.botId", problems, max_length=36, pattern=GUID)
    for scope in _array(bot.get("scopes"), f"{path}.scopes", problems, max_items=3):
        if scope not in BOT_SCOPES:
            problems.append(f"{path}.scopes: {scope!r} is not a bot scope")
    for key in ("needsChannelSelector", "isNotificationOnly", "supportsFiles", "supportsCalling",
                "supportsVideo"):  # fmt: skip
        if key in bot and not isinstance(bot[key], bool):
            problems.append(f"{path}.{key}: must be a boolean")
    lists = _array(bot.get("commandLists", []), f"{path}.commandLists", problems, max_items=3)
    for index, listed in enumerate(lists):
        where = f"{path}.commandLists[{index}]"
        command_list = _object(
            listed,
            where,
            allowed={"scopes", "commands"},
            required={"scopes", "commands"},
            problems=problems,
        )
        for scope in _array(command_list.get("scopes"), f"{where}.scopes", problems, max_items=3):
            if scope not in BOT_SCOPES:
                problems.append(f"{where}.scopes: {scope!r} is not a bot scope")
        commands = _array(command_list.get("commands"), f"{where}.commands", problems, max_items=10)
        for item in commands:
            command = _object(
                item,
                f"{where}.commands[]",
                allowed={"title", "description"},
                required={"title", "description"},
                problems=problems,
            )
            _string(command.get("title"), f"{where}.title", problems, max_length=32, pattern=None)
            _string(
                command.get("description"), f"{where}.desc", problems, max_length=128, pattern=None
            )


# --- PNG decoding -------------------------------------------------------------------------


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and RGBA pixels of an 8-bit RGBA PNG; checks signature and every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, chunks = 8, {}
    idat = b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in {kind!r}"
        chunks[kind] = body
        if kind == b"IDAT":
            idat += body
        offset += 12 + length
    assert b"IEND" in chunks
    width, height, depth, color_type, *_ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color_type) == (8, 6), "expected 8-bit RGBA"
    raw = zlib.decompress(idat)
    stride = 1 + width * 4
    assert len(raw) == stride * height
    pixels = []
    for row in range(height):
        line = raw[row * stride : (row + 1) * stride]
        assert line[0] == 0, "only filter type 0 is expected from our writer"
        pixels.extend(tuple(line[1 + i * 4 : 5 + i * 4]) for i in range(width))
    return width, height, pixels


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path: Path) -> zipfile.ZipFile:
    path = build_app_package(APP_ID, "Assistant", tmp_path / "teams-app.zip")
    return zipfile.ZipFile(path)


def test_the_package_holds_the_manifest_and_both_icons_at_its_root(
    package: zipfile.ZipFile,
) -> None:
    assert sorted(package.namelist()) == ["color.png", "manifest.json", "outline.png"]


def test_the_manifest_validates_against_the_schema_version_it_declares(
    package: zipfile.ZipFile,
) -> None:
    manifest = json.loads(package.read("manifest.json"))
    assert manifest["manifestVersion"] == "1.17"
    assert manifest_1_17_problems(manifest) == []


def test_the_manifest_names_the_app_id_as_app_and_bot(package: zipfile.ZipFile) -> None:
    manifest = json.loads(package.read("manifest.json"))
    assert manifest["id"] == APP_ID
    [bot] = manifest["bots"]
    assert bot["botId"] == APP_ID
    assert set(bot["scopes"]) == {"personal", "team", "groupChat"}
    assert manifest["name"]["short"] == "Assistant"
    assert "{{" not in json.dumps(manifest)


def test_the_bot_accepts_files_in_personal_chats(package: zipfile.ZipFile) -> None:
    [bot] = json.loads(package.read("manifest.json"))["bots"]
    assert bot["supportsFiles"] is True
    assert "personal" in bot["scopes"]


def test_the_icons_have_the_sizes_the_manifest_requires(package: zipfile.ZipFile) -> None:
    manifest = json.loads(package.read("manifest.json"))
    color = decode_png(package.read(manifest["icons"]["color"]))
    outline = decode_png(package.read(manifest["icons"]["outline"]))
    assert color[:2] == (192, 192)
    assert outline[:2] == (32, 32)
    # The outline icon is white on transparent, nothing else.
    assert {pixel for pixel in outline[2] if pixel[3]} == {(255, 255, 255, 255)}
    assert any(pixel[3] == 0 for pixel in outline[2])


def test_the_committed_icons_are_the_drawn_ones() -> None:
    for name, data in draw_icons().items():
        assert (TEMPLATE_DIR / name).read_bytes() == data


def test_the_validator_itself_catches_violations(package: zipfile.ZipFile) -> None:
    manifest = json.loads(package.read("manifest.json"))
    manifest["name"]["short"] = "x" * 31
    manifest["bots"][0]["scopes"].append("meetings")
    manifest["id"] = "not-a-guid"
    manifest["colour"] = "#fff"
    del manifest["accentColor"]
    assert sorted(manifest_1_17_problems(manifest)) == sorted(
        [
            "$: unknown property 'colour'",
            "$: missing 'accentColor'",
            "id: does not match ^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$",
            "name.short: longer than 30",
            "bots[0].scopes: more than 3 items",
            "bots[0].scopes: 'meetings' is not a bot scope",
        ]
    )


@pytest.mark.parametrize(
    ("app_id", "name", "fields", "problem"),
    [
        ("", "Assistant", {}, "app_id must be a GUID"),
        ("my-bot", "Assistant", {}, "app_id must be a GUID"),
        (APP_ID, "A" * 31, {}, "1-30 characters"),
        (APP_ID, "Assistant", {"description_short": "d" * 81}, "description_short"),
        (APP_ID, "Assistant", {"version": "1.0"}, "semver"),
        (APP_ID, "Assistant", {"website_url": "http://example.com"}, "website_url"),
        (APP_ID, "Assistant", {"accent_color": "blue"}, "accent_color"),
    ],
)
def test_values_the_schema_would_refuse_are_refused_before_writing(
    tmp_path: Path, app_id: str, name: str, fields: dict[str, str], problem: str
) -> None:
    out = tmp_path / "app.zip"
    with pytest.raises(ConfigError, match=problem):
        build_app_package(app_id, name, out, **fields)  # type: ignore[arg-type]
    assert not out.exists()


def test_the_same_inputs_give_the_same_package_bytes(tmp_path: Path) -> None:
    first = build_app_package(APP_ID, "Assistant", tmp_path / "a.zip").read_bytes()
    second = build_app_package(APP_ID, "Assistant", tmp_path / "b.zip").read_bytes()
    assert first == second
