"""The one reader of files named in configuration: config, rules, scenario, kubeconfig, TLS and
token files all come through here, so each refuses bad input the same way.

A file must be a regular file (a FIFO given as ``--config`` would block forever, ``/dev/zero``
would never end), at most :data:`MAX_FILE_BYTES`, and text must be UTF-8. YAML is PyYAML's safe
loader except that a mapping may not repeat a key: PyYAML keeps the last value without a word,
so a duplicated ``port:`` would silently win over the first. Every failure is a
:class:`ConfigError` naming the file (and the config field, when the caller gives one), in the
shape every configuration error takes (:func:`field_error`, :func:`format_validation_error`).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import yaml
    from pydantic import ValidationError

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Far beyond any real config, rules or scenario file (a kubeconfig with embedded certificates
for dozens of clusters is still well under a megabyte)."""


class ConfigError(Exception):
    """Configuration that cannot be used; the message is meant for a person.

    ``brief`` is the message on one line, for a report that shows it among others (doctor)."""

    def __init__(self, message: str, *, brief: str | None = None) -> None:
        super().__init__(message)
        self.brief = brief or " ".join(message.split())


def field_error(field: str, message: str) -> ConfigError:
    """The CLI's shape of a problem with one config field."""
    return ConfigError(f"invalid configuration:\n  {field}: {message}", brief=f"{field}: {message}")


Loc = tuple[int | str, ...]


def format_validation_error(
    err: ValidationError, prefix: str = "", origin: Callable[[Loc], str | None] | None = None
) -> str:
    """The CLI's shape of a validation error (of a config model, a scenario file, a fault request):
    one line per bad field; ``origin`` says where a field's value came from, when known."""
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        notes = []
        if "input" in e and not isinstance(e["input"], dict | list) and e["type"] != "missing":
            notes.append(f"got {e['input']!r}")
        source = origin(e["loc"]) if origin is not None else None
        if source:
            notes.append(source)
        shown = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {loc or '(top level)'}: {msg}{shown}")
    return "invalid configuration:\n" + "\n".join(lines)


def _error(message: str, field: str | None) -> ConfigError:
    return field_error(field, message) if field else ConfigError(message)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _not_regular(mode: int) -> str | None:
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_config_bytes(path: Path, what: str, *, field: str | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most :data:`MAX_FILE_BYTES`.

    ``what`` names the file for a person ("config file", "rules file"); ``field`` is the config
    key that named it, if any."""
    try:
        # Non-blocking, so that opening a FIFO returns at once and fstat can refuse it; the
        # check is on the open descriptor, so nothing can swap the file in between.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket: there is nothing to open
            try:
                kind = _not_regular(os.stat(path).st_mode)
            except OSError:
                kind = None
            if kind:
                raise _error(f"{what} {path} is {kind}, not a regular file", field) from None
        raise _error(f"cannot read {what} {path}: {e.strerror or e}", field) from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind:
            raise _error(f"{what} {path} is {kind}, not a regular file", field)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise _error(f"cannot read {what} {path}: {e.strerror or e}", field) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise _error(f"{what} {path} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB", field)
    return data


def read_config_text(path: Path, what: str, *, field: str | None = None) -> str:
    """:func:`read_config_bytes`, decoded as UTF-8."""
    data = read_config_bytes(path, what, field=field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _error(
            f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, column {column})",
            field,
        ) from None


@functools.cache
def _unique_key_loader() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader, refusing a key written twice in one mapping. Made on first use: only a
    process that reads a YAML file imports yaml (the exporter without ``--config`` reads none:
    docs/exporter.md, "What the exporter imports")."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' overrides by design
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {first + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


class _NotPlainJson(ValueError):
    """JSON that YAML is to read instead: a key written twice (YAML's error names both lines),
    or NaN and Infinity (not numbers in YAML)."""


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise _NotPlainJson
    return mapping


def _json_constant(_name: str) -> Any:
    raise _NotPlainJson


def parse_yaml(text: str, what: str, *, field: str | None = None) -> Any:
    """One YAML document, duplicate keys refused; ``what`` names its source in errors.

    A document that is plain JSON (which is YAML; the Helm chart writes the exporter's
    configuration so) is read by :mod:`json`, and yaml is not imported: about 0.7 MiB in every
    exporter's process (docs/exporter.md, "What the exporter imports"). Anything else, and JSON
    that YAML reads differently, goes to YAML's parser, whose messages name the line."""
    try:
        return json.loads(text, object_pairs_hook=_json_object, parse_constant=_json_constant)
    except (ValueError, RecursionError):
        pass
    import yaml

    try:
        return yaml.load(text, Loader=_unique_key_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None)
        problem = f": {problem}" if problem else ""
        raise _error(f"{what} is not valid YAML{where}{problem}", field) from None


def read_yaml_mapping(
    path: Path, what: str, *, field: str | None = None, allow_empty: bool = True
) -> dict[str, Any]:
    """A YAML file holding a mapping (``{}`` for an empty file when ``allow_empty``)."""
    data = parse_yaml(read_config_text(path, what, field=field), f"{what} {path}", field=field)
    if data is None:
        if allow_empty:
            return {}
        raise _error(f"{what} {path} is empty", field)
    if not isinstance(data, dict):
        raise _error(f"{what} {path} must hold a mapping at the top level", field)
    return data
