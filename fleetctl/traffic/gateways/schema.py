"""Typed gateway options, read and checked in one place.

Each kind declares its options as a frozen dataclass in its `options.py`: one field per
option, its Python type, its default (none: the option is required) and its help text, through
`option()`. `parse_options(schema, raw, label)` turns the JSON object stored on the Gateway row
into that dataclass, or raises OptionsError (a permanent AdapterError: retrying cannot fix a
configuration) listing every problem, each naming its option:

- unknown keys (a typo would otherwise be ignored silently);
- required options missing or empty;
- values of the wrong type (JSON has no tuples or paths: a list is read as a tuple, an integer
  as a float; a string is never read as a number, nor a number as a boolean);
- values outside `choices`, `minimum`/`maximum`, or refused by the option's own `check`.

A kind also declares how its gateway is reached (`AddressRule`: an HTTP(S) URL, a socket, a
directory), checked the same way for every kind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from fleetctl.core.destinations import GATEWAYS, url_problem
from fleetctl.traffic.gateways.base import AdapterError


class OptionsError(AdapterError):
    """Options a gateway cannot work with; `problems` has one sentence per option."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems), permanent=True)
        self.problems = problems


def option(default: Any = MISSING, *, help: str, default_factory: Any = MISSING,
           choices: tuple[Any, ...] | None = None, minimum: float | None = None,
           maximum: float | None = None, check: Callable[[Any], str | None] | None = None,
           parse: Callable[[Any], Any] | None = None) -> Any:
    """One option of a kind's options dataclass. No default (and no default_factory): the
    option is required. `check(value)` returns why a well-typed value is refused, or None.
    `parse(raw)` replaces the type check for a structured value: it returns the typed value
    or raises ValueError saying what is wrong."""
    metadata = {"help": help, "choices": choices, "minimum": minimum, "maximum": maximum,
                "check": check, "parse": parse}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class OptionInfo:
    """One option as a person reads it: the form, the API schema and the docs list these."""

    name: str
    type: str
    required: bool
    default: Any
    help: str

    def describe(self) -> str:
        if self.required:
            return f"{self.name} ({self.type}, required): {self.help}"
        return f"{self.name} ({self.type}, default {_json(self.default)}): {self.help}"


def describe(schema: type) -> list[OptionInfo]:
    hints = get_type_hints(schema)
    infos = []
    for f in dataclasses.fields(schema):
        required = f.default is MISSING and f.default_factory is MISSING
        default = None if required else (
            f.default if f.default is not MISSING else f.default_factory())  # type: ignore[misc]
        infos.append(OptionInfo(name=f.name, type=_type_text(hints[f.name]), required=required,
                                default=default, help=f.metadata.get("help", "")))
    return infos


@functools.cache
def _schema(schema: type) -> tuple[dict[str, dataclasses.Field[Any]], dict[str, Any]]:
    """The fields and resolved types of a schema, read once (an adapter is built per push)."""
    return {f.name: f for f in dataclasses.fields(schema)}, get_type_hints(schema)


def parse_options(schema: type, raw: Any, label: str) -> Any:
    """`raw` (the Gateway row's options) as an instance of `schema`, or OptionsError."""
    if not isinstance(raw, Mapping):
        raise OptionsError([f"options must be an object of option names and values, not "
                            f"{_json(raw)}"])
    fields, hints = _schema(schema)
    problems = []
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        verb = "is not an option" if len(unknown) == 1 else "are not options"
        problems.append(f"{_names(unknown)} {verb} of {label} gateways; theirs are "
                        f"{', '.join(sorted(fields))}")
    values = {}
    for name, f in fields.items():
        required = f.default is MISSING and f.default_factory is MISSING
        if name not in raw or (required and raw[name] in (None, "")):
            if required:
                problems.append(f"options.{name} is required: {f.metadata.get('help', '')}")
            continue
        try:
            values[name] = _value(raw[name], hints[name], f.metadata)
        except ValueError as exc:
            problems.append(f"options.{name} {exc}")
    if problems:
        raise OptionsError(problems)
    return schema(**values)


def _value(raw: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    if meta.get("parse") is not None:
        return meta["parse"](raw)
    value = _typed(raw, hint)
    if value is None:
        return None
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"must be one of {', '.join(_json(c) for c in choices)}, "
                         f"not {_json(raw)}")
    low, high = meta.get("minimum"), meta.get("maximum")
    if (low is not None and value < low) or (high is not None and value > high):
        span = (f"from {low:g} to {high:g}" if low is not None and high is not None
                else f"at least {low:g}" if low is not None else f"at most {high:g}")
        raise ValueError(f"must be {span}, not {_json(raw)}")
    check = meta.get("check")
    problem = check(value) if check is not None else None
    if problem:
        raise ValueError(problem)
    return value


def _typed(raw: Any, hint: Any) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _typed(raw, arg)
            except ValueError:
                pass
        raise ValueError(f"must be {_type_text(hint)}, not {_json(raw)}")
    if hint is Any:
        return raw
    if hint is bool:
        if isinstance(raw, bool):
            return raw
    elif hint is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    elif hint is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
    elif hint is str:
        if isinstance(raw, str):
            return raw
    elif origin is tuple:
        if isinstance(raw, list | tuple):
            return tuple(_typed(item, args[0]) for item in raw)
    elif origin in (dict, Mapping):
        if isinstance(raw, Mapping) and all(isinstance(key, str) for key in raw):
            return {key: _typed(item, args[1]) for key, item in raw.items()}
    else:  # pragma: no cover - a schema using a type this reader does not know
        raise TypeError(f"option type {hint!r} is not supported")
    raise ValueError(f"must be {_type_text(hint)}, not {_json(raw)}")


def _type_text(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        kinds = [_type_text(arg) for arg in args if arg is not type(None)]
        return " or ".join(kinds) + (" or null" if type(None) in args else "")
    if origin is tuple:
        return f"a list of {_type_text(args[0]).removeprefix('a ')}s"
    if origin in (dict, Mapping):
        return "an object"
    return {bool: "true or false", int: "a whole number", float: "a number",
            str: "a string"}.get(hint, "a value")


def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _names(names: list[str]) -> str:
    return ", ".join(f"options.{name}" for name in names)


# --- how a gateway is reached ---------------------------------------------------------------

@dataclass(frozen=True)
class AddressRule:
    """What a kind's admin_address holds, and the check every value must pass."""

    help: str  # shown in the API schema and the docs, e.g. "the admin URL, http(s)://host:port"
    check: Callable[[str], str | None]  # why a value is refused, or None

    def problem(self, value: str, label: str) -> str | None:
        why = self.check(value)
        return f"{label} gateways are reached at {self.help}: {why}." if why else None


def http_url(what: str) -> AddressRule:
    def check(value: str) -> str | None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"{value!r} is not an http:// or https:// URL with a host"
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            return f"{value!r} has no valid port"
        return url_problem(value, purpose=GATEWAYS)
    return AddressRule(help=f"the {what} URL, http(s)://host:port", check=check)


_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$")


def socket_address(what: str) -> AddressRule:
    def check(value: str) -> str | None:
        if value.startswith("/"):
            return None
        if _HOST_PORT.match(value):
            # Checked as the address it is: the same rules as an admin URL's host and port.
            return url_problem(f"http://{value}", purpose=GATEWAYS)
        return f"{value!r} is neither an absolute path nor host:port"
    return AddressRule(help=f"the {what}, an absolute unix socket path or host:port",
                       check=check)


def directory(what: str, *, max_length: int | None = None) -> AddressRule:
    def check(value: str) -> str | None:
        if not value.startswith("/"):
            return f"{value!r} is not an absolute path"
        if max_length is not None and len(value) > max_length:
            return f"{value!r} is longer than {max_length} characters"
        return None
    return AddressRule(help=f"the {what}, an absolute directory path", check=check)


# --- the shadow collector a gateway mirrors to -----------------------------------------------

def collector_url_problem(value: str) -> str | None:
    """Why `value` cannot be a shadow collector URL, or None: http://host:port, nothing more
    (a mirrored request keeps its own path; the collector answers at its root)."""
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return f"must be http://host:port, not {value!r}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"must be http://host:port without a path, not {value!r}"
    return None


def shadow_collector_option() -> Any:
    """The `shadow_collector` option kinds that mirror share (default: SHADOW_COLLECTOR_URL)."""
    return option(None, check=collector_url_problem,
                  help="the shadow collector mirrored requests go to, http://host:port; "
                       "default: the SHADOW_COLLECTOR_URL setting")


def absolute_path(value: str) -> str | None:
    """An option check: a path on the gateway's host must be absolute."""
    return None if value.startswith("/") else f"must be an absolute path, not {value!r}"


def access_log_option() -> Any:
    """The `access_log` option of kinds that write one (their `accesslog.py` parses it)."""
    return option(None, check=absolute_path,
                  help="the access log file the gateway writes (one JSON object per request) "
                       "and the telemetry ingester follows, on the gateway's host; none: no "
                       "live telemetry from this gateway")


# The timeouts of kinds that reload a rendered config (HAProxy, nginx): the same words and
# limits on every such kind.

def connect_timeout_option() -> Any:
    """The `connect_timeout_s` option: how long a connect to a pool may take."""
    return option(2.0, minimum=0.001, maximum=600, help="seconds to connect to a pool")


def stream_timeout_option() -> Any:
    """The `stream_timeout_s` option: how long a request or stream may stay silent."""
    return option(3600, minimum=1, maximum=7 * 86400,
                  help="seconds a request or stream may stay silent")


def reload_timeout_option() -> Any:
    """The `reload_timeout_s` option: how long a reload may take."""
    return option(10.0, minimum=0.1, maximum=600,
                  help="seconds a reload may take before it counts as failed")
