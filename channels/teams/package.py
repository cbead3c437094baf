"""The Teams app package: `manifest.json` and two icons in a zip, ready to sideload.

The manifest is the template `config/teams/manifest.json` (manifest schema 1.17) with its
`{{placeholders}}` filled from config values; the icons are the PNGs beside it (`color.png`
192x192, `outline.png` 32x32 white on transparent), drawn by `draw_icons` when missing. The
values the schema constrains (GUID, lengths, semver, https URLs, colour) are checked before
anything is written, so a package that Teams would refuse is never produced.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from errors import ConfigError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "config" / "teams"
ICON_SIZES = {"color.png": 192, "outline.png": 32}
_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_HEX_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# Fixed zip timestamps: the same inputs always give the same package bytes.
_ZIP_DATE = (2024, 1, 1, 0, 0, 0)

Pixel = tuple[int, int, int, int]


def build_app_package(
    app_id: str,
    name: str,
    out: Path,
    *,
    full_name: str | None = None,
    description_short: str = "Your assistant, in Teams chats and channels.",
    description_full: str = (
        "Chat with the assistant one to one, or mention it in a channel or group chat. "
        "Conversations continue across Teams, Slack, email and the web."
    ),
    version: str = "1.0.0",
    developer_name: str = "Assistant Gateway",
    website_url: str = "https://www.example.com",
    privacy_url: str = "https://www.example.com/privacy",
    terms_url: str = "https://www.example.com/terms",
    accent_color: str = "#4F6BED",
    template_dir: Path = TEMPLATE_DIR,
) -> Path:
    """Write the sideloadable zip (manifest.json and icons at its root) to `out`; return `out`.

    Raises `ConfigError` naming every value the manifest schema would refuse.
    """
    values = {
        "app_id": app_id.strip(),
        "name": name.strip(),
        "full_name": (full_name or name).strip(),
        "description_short": description_short,
        "description_full": description_full,
        "version": version,
        "developer_name": developer_name,
        "website_url": website_url,
        "privacy_url": privacy_url,
        "terms_url": terms_url,
        "accent_color": accent_color,
    }
    problems = _value_problems(values)
    if problems:
        raise ConfigError("\n".join(problems), problems=problems)
    template = json.loads((template_dir / "manifest.json").read_text(encoding="utf-8"))
    manifest = _fill(template, values)
    icons = draw_icons(accent_color)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as package:
        _write(package, "manifest.json", json.dumps(manifest, indent=2).encode() + b"\n")
        for filename in ICON_SIZES:
            path = template_dir / filename
            _write(package, filename, path.read_bytes() if path.is_file() else icons[filename])
    return out


def draw_icons(accent_color: str = "#4F6BED") -> dict[str, bytes]:
    """The two icons as PNG bytes: a white speech bubble on the accent colour (192x192), and
    its white outline on transparent (32x32), as the manifest schema asks."""
    red, green, blue = (int(accent_color[i : i + 2], 16) for i in (1, 3, 5))
    accent: Pixel = (red, green, blue, 255)
    white: Pixel = (255, 255, 255, 255)
    clear: Pixel = (0, 0, 0, 0)

    def color(x: int, y: int) -> Pixel:
        inside = _bubble_distance(x / 192, y / 192) <= 0
        dot = any((x - cx) ** 2 + (y - 88) ** 2 <= 81 for cx in (66, 96, 126))
        return white if inside and not dot else accent

    def outline(x: int, y: int) -> Pixel:
        distance = _bubble_distance((x + 0.5) / 32, (y + 0.5) / 32)
        return white if -0.06 <= distance <= 0 else clear

    return {"color.png": png(192, 192, color), "outline.png": png(32, 32, outline)}


def png(width: int, height: int, pixel: Callable[[int, int], Pixel]) -> bytes:
    """An RGBA PNG drawn by `pixel(x, y)`, written with zlib and struct only."""
    rows = b"".join(
        b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def _bubble_distance(x: float, y: float) -> float:
    """Negative inside a speech bubble (an ellipse with a tail) drawn on the unit square."""
    ellipse = ((x - 0.5) / 0.36) ** 2 + ((y - 0.46) / 0.28) ** 2 - 1
    # The tail: a triangle below the ellipse's lower left.
    in_tail = 0.62 <= y <= 0.84 and 0.3 <= x <= 0.3 + (0.84 - y) * 0.9
    return min(ellipse / 4, -0.01) if in_tail else ellipse / 4


def _value_problems(values: dict[str, str]) -> list[str]:
    checks: list[tuple[bool, str]] = [
        (bool(_GUID.match(values["app_id"])), "channels.teams.app_id must be a GUID (the app id)"),
        (0 < len(values["name"]) <= 30, "the app name must be 1-30 characters"),
        (0 < len(values["full_name"]) <= 100, "the full app name must be 1-100 characters"),
        (0 < len(values["description_short"]) <= 80, "description_short: 1-80 characters"),
        (0 < len(values["description_full"]) <= 4000, "description_full: 1-4000 characters"),
        (bool(_SEMVER.match(values["version"])), "version must be semver, like 1.0.0"),
        (0 < len(values["developer_name"]) <= 32, "developer_name: 1-32 characters"),
        (bool(_HEX_COLOR.match(values["accent_color"])), "accent_color must look like #4F6BED"),
    ]
    for key in ("website_url", "privacy_url", "terms_url"):
        url = values[key]
        checks.append((url.lower().startswith("https://") and len(url) <= 2048, f"{key}: https"))
    return [problem for ok, problem in checks if not ok]


def _fill(node: Any, values: dict[str, str]) -> Any:
    """The template with every `{{name}}` replaced; an unknown placeholder is an error."""
    if isinstance(node, dict):
        return {key: _fill(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill(item, values) for item in node]
    if isinstance(node, str):

        def replace(match: re.Match[str]) -> str:
            if match.group(1) not in values:
                raise ConfigError(f"manifest template: unknown placeholder {match.group(0)}")
            return values[match.group(1)]

        return _PLACEHOLDER.sub(replace, node)
    return node


def _write(package: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    package.writestr(info, data)
