"""Loading and checking the configuration file.

``load_config`` turns a YAML file into a frozen `GatewayConfig` (the schema lives in
`gateway.settings`) or raises `ConfigError`; ``check_config`` returns every problem at once as
`ConfigProblem` values that print as ``FILE:LINE: key.path: message``.

One pass over the file collects all problems:

1. the YAML is composed into a node tree (PyYAML, safe tags only), which keeps line numbers;
2. walking that tree builds the plain data, substitutes ``${VAR}`` / ``${VAR:-default}`` in
   string values, and records the line of every key path (``("identity", "users", 0, "id")``);
3. pydantic validates the data, and each error location is mapped back to the line of that
   key, or of its closest ancestor present in the file.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from errors import ConfigError
from gateway.settings import GatewayConfig

__all__ = ["ConfigProblem", "check_config", "format_key_path", "load_config"]

KeyPath = tuple[str | int, ...]
"""A location in the config: mapping keys and list indexes, e.g. ``("identity", "users", 0)``."""

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"

# `$${` is matched first so that an escaped reference is never substituted.
_REFERENCE_RE = re.compile(
    r"(?P<escape>\$\$\{)"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<malformed>\$\{[^}]*\}?)"
)

# Pydantic prefixes the message of a plain ValueError/AssertionError raised in a validator.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")

_FRIENDLIER_MESSAGES = {
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
    "dict_type": "expected a mapping of keys",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
}


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config file, located as precisely as the file allows."""

    file: str
    line: int | None
    key_path: str
    message: str

    def __str__(self) -> str:
        """``FILE:LINE: key.path: message``; the line and the key path are left out if unknown."""
        location = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.key_path:
            return f"{location}: {self.key_path}: {self.message}"
        return f"{location}: {self.message}"


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Load and validate the config file at ``path``; ``None`` gives the embedded defaults.

    ``environ`` is where ``${VAR}`` references are looked up (default: ``os.environ``).
    Raises `ConfigError` carrying every problem, one per line, also in ``.problems``.
    """
    if path is None:
        return GatewayConfig()
    config, problems = _read_config(path, environ)
    if config is None or problems:
        lines = tuple(str(problem) for problem in problems)
        raise ConfigError("\n".join(lines), problems=lines)
    return config


def check_config(path: Path | str, environ: Mapping[str, str] | None = None) -> list[ConfigProblem]:
    """Every problem in the config file at ``path``, sorted by line; empty when it is valid."""
    return _read_config(Path(path), environ)[1]


def format_key_path(key_path: KeyPath) -> str:
    """Print a key path the way the docs write it: ``identity.users[0].id``."""
    text = ""
    for part in key_path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _read_config(
    path: Path, environ: Mapping[str, str] | None
) -> tuple[GatewayConfig | None, list[ConfigProblem]]:
    """Read, substitute and validate; the config is returned only when there is no problem."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, [ConfigProblem(file, None, "", f"cannot read file: {reason}")]

    document = _Document(file, os.environ if environ is None else environ)
    data = document.load(text)
    if document.fatal:
        return None, document.problems
    if data is None:  # an empty file (or only comments): the embedded defaults
        data = {}
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({data!r})"
        problem = ConfigProblem(
            file,
            1,
            "",
            f"the top level must be a mapping of sections (server, storage, ...), not {kind}",
        )
        return None, [problem]

    config: GatewayConfig | None = None
    problems = list(document.problems)
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems.extend(document.to_problems(exc.errors()))
    problems = sorted(set(problems), key=_problem_order)
    return (None if problems else config), problems


def _problem_order(problem: ConfigProblem) -> tuple[int, str, str]:
    """Sort by line (unknown lines last), then key path, so the output reads top to bottom."""
    line = problem.line if problem.line is not None else 1 << 30
    return line, problem.key_path, problem.message


MAX_VALUES = 100_000


class _TooManyValuesError(Exception):
    """The document expands to more values than any config needs."""


@dataclass
class _Document:
    """One parse of a config file: its data, the line of each key path and the problems."""

    file: str
    environ: Mapping[str, str]
    lines: dict[KeyPath, int] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)
    # Key paths whose value is already reported (e.g. a missing env var); validation errors
    # there would only repeat the same problem in other words.
    reported: set[KeyPath] = field(default_factory=set)
    # True when the YAML itself is unusable: nothing can be validated.
    fatal: bool = False
    _loader: yaml.SafeLoader | None = None
    _building: set[int] = field(default_factory=set)
    _values: int = 0

    def load(self, text: str) -> object:
        """Compose ``text`` and build its data; YAML errors become a single fatal problem."""
        try:
            self._loader = yaml.SafeLoader(text)
            root = self._loader.get_single_node()
            if root is None:
                return None
            self.lines[()] = _line_of(root) or 1
            return self._build(root, ())
        except yaml.MarkedYAMLError as exc:
            self._fatal(exc)
            return None
        except yaml.YAMLError as exc:
            self.fatal = True
            self.problems = [ConfigProblem(self.file, None, "", f"invalid YAML: {exc}")]
            return None
        except (RecursionError, _TooManyValuesError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            self.fatal = True
            self.problems = [ConfigProblem(self.file, None, "", f"unusable YAML: {reason}")]
            return None
        finally:
            if self._loader is not None:
                self._loader.dispose()

    def _fatal(self, exc: yaml.MarkedYAMLError) -> None:
        """Report a syntax error at the line PyYAML points to."""
        mark = exc.problem_mark or exc.context_mark
        reason = ", ".join(part for part in (exc.context, exc.problem) if part) or str(exc)
        line = mark.line + 1 if mark is not None else None
        self.fatal = True
        self.problems = [ConfigProblem(self.file, line, "", f"invalid YAML: {reason}")]

    def _build(self, node: Node, path: KeyPath) -> object:
        """The Python value of ``node``, recording key lines and substituting env references."""
        self._values += 1
        if self._values > MAX_VALUES:
            # Aliases can make a small file expand to billions of values ("billion laughs").
            raise _TooManyValuesError(f"more than {MAX_VALUES} values (aliases expand too much)")
        if isinstance(node, ScalarNode):
            if node.tag == _STR_TAG:
                return self._substitute(node, path)
            return self._construct(node, path)
        if id(node) in self._building:
            self._report(path, _line_of(node), "recursive alias: a value cannot contain itself")
            return None
        self._building.add(id(node))
        try:
            if isinstance(node, MappingNode) and node.tag == _MAP_TAG:
                return self._build_mapping(node, path)
            if isinstance(node, SequenceNode) and node.tag == _SEQ_TAG:
                return self._build_sequence(node, path)
            return self._construct(node, path)
        finally:
            self._building.discard(id(node))

    def _build_mapping(self, node: MappingNode, path: KeyPath) -> dict[str, object]:
        """A dict; own keys repeated in one mapping are reported, merged (``<<``) keys are not."""
        own_keys = [key for key, _ in node.value if key.tag != _MERGE_TAG]
        assert self._loader is not None
        self._loader.flatten_mapping(node)  # resolves `<<: *anchor` merges into node.value
        first_line: dict[str, int | None] = {}
        for key_node in own_keys:
            key = self._key(key_node)
            if key in first_line:
                message = f"duplicate key {key!r} (first at line {first_line[key]})"
                self._report((*path, key), _line_of(key_node), message)
            else:
                first_line[key] = _line_of(key_node)
        result: dict[str, object] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node)
            child = (*path, key)
            line = _line_of(key_node)
            if line is not None:  # the last occurrence wins, as it does for the value
                self.lines[child] = line
            result[key] = self._build(value_node, child)
        return result

    def _build_sequence(self, node: SequenceNode, path: KeyPath) -> list[object]:
        """A list whose items are located by index."""
        items: list[object] = []
        for index, item_node in enumerate(node.value):
            line = _line_of(item_node)
            if line is not None:
                self.lines[(*path, index)] = line
            items.append(self._build(item_node, (*path, index)))
        return items

    @staticmethod
    def _key(node: Node) -> str:
        """A mapping key, as written: every key of the schema is a name, so ``on:`` or ``80:``
        stay the strings "on" and "80" (and are reported as unknown keys), not True and 80."""
        if isinstance(node, ScalarNode):
            return str(node.value)
        raise ConstructorError(None, None, "a mapping key must be a plain value", node.start_mark)

    def _construct(self, node: Node, path: KeyPath) -> object:
        """Let PyYAML's safe constructor read a tagged value (int, bool, timestamp ...)."""
        assert self._loader is not None
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError):
            # e.g. `!!int abc`: PyYAML raises plain Python errors for bad explicit tags.
            self._report(path, _line_of(node), f"invalid value for tag {node.tag}")
            return None

    def _substitute(self, node: ScalarNode, path: KeyPath) -> str:
        """Replace ``${VAR}``, ``${VAR:-default}`` and ``$${`` in one string value."""
        value: str = node.value

        def replace(match: re.Match[str]) -> str:
            if match["escape"]:
                return "${"
            if match["malformed"]:
                self._report(
                    path,
                    _line_of(node),
                    f"malformed reference {match['malformed']!r}: use ${{VAR}} or "
                    "${VAR:-default}, or $${ for a literal ${",
                )
                return ""
            name = match["name"]
            if name in self.environ:
                return self.environ[name]
            if match["default"] is not None:
                return match["default"]
            self._report(path, _line_of(node), f"environment variable {name} is not set")
            return ""

        return _REFERENCE_RE.sub(replace, value)

    def _report(self, path: KeyPath, line: int | None, message: str) -> None:
        """Record a problem found while reading the file and mute validation errors there."""
        self.reported.add(path)
        self.problems.append(ConfigProblem(self.file, line, format_key_path(path), message))

    def to_problems(self, errors: list[ErrorDetails]) -> list[ConfigProblem]:
        """Turn pydantic errors into located problems, skipping keys already reported."""
        problems = []
        for error in errors:
            loc: KeyPath = tuple(error["loc"])
            if any(loc[: len(done)] == done for done in self.reported):
                continue
            problems.append(
                ConfigProblem(self.file, self._line_for(loc), format_key_path(loc), _message(error))
            )
        return problems

    def _line_for(self, loc: KeyPath) -> int | None:
        """The line of ``loc``, else of its closest ancestor that appears in the file."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(loc[:end])
            if line is not None:
                return line
        return None


def _message(error: ErrorDetails) -> str:
    """A readable message for one pydantic error."""
    if error["type"] == "extra_forbidden":
        return _unknown_key_message(tuple(error["loc"]))
    if error["type"] in _FRIENDLIER_MESSAGES:
        return _FRIENDLIER_MESSAGES[error["type"]]
    message = error["msg"]
    for prefix in _PYDANTIC_PREFIXES:
        message = message.removeprefix(prefix)
    return message


def _unknown_key_message(loc: KeyPath) -> str:
    """``unknown key (did you mean 'archive_after'?)``, or the list of allowed keys."""
    allowed = _allowed_keys(loc[:-1])
    key = str(loc[-1]) if loc else ""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    if allowed:
        return f"unknown key (allowed: {', '.join(allowed)})"
    return "unknown key"


def _allowed_keys(loc: KeyPath) -> list[str]:
    """The field names of the model found at ``loc`` in the schema (empty when none is)."""
    model: type[BaseModel] = GatewayConfig
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the item model was already unwrapped from tuple[...]
        info = model.model_fields.get(part)
        found = _model_in(info.annotation) if info is not None else None
        if found is None:
            return []
        model = found
    return list(model.model_fields)


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model class inside an annotation such as ``tuple[UserConfig, ...]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def _line_of(node: Node) -> int | None:
    """The 1-based line where ``node`` starts."""
    mark = node.start_mark
    return None if mark is None else mark.line + 1
