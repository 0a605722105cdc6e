"""Reading a config file into a :class:`~kuikproxy.config.models.Config` (SPEC §7).

The one rule that pydantic cannot express alone is the ``default`` block: it is merged *under*
each host's block (the host's keys win, nested blocks merge key by key, lists are replaced whole)
before that host is validated, so ``docker.io: {check: {interval: 30s}}`` keeps the default
``check.timeout``, and ``docker.io: {quota: {buckets: [...]}}`` keeps the default
``quota.preset``.

Every problem is collected and reported at once as ``"path: reason"`` lines, with the keys as
written in the file, so an operator fixes a file in one pass rather than one error per run.

A *file* with no settings in it — no document (empty, blank, comments only, ``---``), a
``null`` one (``null``, ``~``) or a mapping without a key (``{}``) — is refused, not read as the
embedded default: the operator named a file, and one truncated, emptied or templated to nothing
by mistake would otherwise drop every host it configures at the next reload — each then
refused ``403`` or paced on the default's intervals. No file at all (``load_config(None)``,
``serve`` without ``--config``) is the embedded default.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from kuikproxy.config.base import NestedErrors, camel, format_path
from kuikproxy.config.fields import validate_host
from kuikproxy.config.models import DEFAULT_BLOCK, Config
from kuikproxy.config.registry import RegistrySettings
from kuikproxy.errors import ConfigError

__all__ = ["EMBEDDED_DEFAULT_SOURCE", "build_config", "load_config", "parse_config"]

EMBEDDED_DEFAULT_SOURCE = "<embedded default>"
"""The source name of the configuration used when no file is given."""

_CONFIG = TypeAdapter(Config)
_REGISTRY = TypeAdapter(RegistrySettings)

# Keys of the ``default`` block that name one host's own resources. A default ``upstream``
# would send every registry's traffic to one endpoint, and default ``credentials`` would hand
# one registry's secret to all of them (R5), so both are refused there.
_HOST_ONLY_KEYS = ("upstream", "credentials")
# Blocks replaced whole rather than merged: mixing a default username with a host's
# dockerConfigFile would produce credentials nobody wrote. (Unreachable today, since
# credentials are refused in ``default``, but it keeps the merge honest if that changes.)
_ATOMIC_KEYS = frozenset({"credentials"})


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that refuses duplicate keys, which YAML would silently let the last win."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        # Merge keys (<<) legitimately repeat keys that the mapping then overrides.
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f'found duplicate key "{key}"',
                    key_node.start_mark,
                )
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """The configuration in the file at ``path``; ``None`` is the embedded default.

    Raises :class:`ConfigError` listing every problem, including an unreadable file, invalid
    YAML, a file with no settings in it, and a top level that is not a mapping.
    """
    if path is None:
        return parse_config("", EMBEDDED_DEFAULT_SOURCE)
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise ConfigError([f"{source}: {error.strerror or error}"]) from None
    except UnicodeDecodeError as error:
        raise ConfigError([f"{source}: not UTF-8 text ({error.reason})"]) from None
    raw = _document(text, source)
    if raw is None or raw == {}:  # a file named with no settings is a mistake (see above)
        raise ConfigError(
            [
                f"{source}: no settings in it (empty, comments only, null or {{}}); "
                "serve without --config runs on the embedded default"
            ]
        )
    return _config(raw, source)


def parse_config(text: str, source: str = "<string>") -> Config:
    """The configuration in the YAML ``text``; ``source`` names it in YAML errors. A text with
    no settings in it is the embedded default (a *file* with none is refused by
    :func:`load_config`)."""
    raw = _document(text, source)
    return _config({} if raw is None else raw, source)


def _document(text: str, source: str) -> Any:
    """The YAML document in ``text``, None if there is none (or only ``null``)."""
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as error:
        raise ConfigError([_yaml_error(source, error)]) from None


def _config(raw: Any, source: str) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: the top level must be a mapping, not {_kind(raw)}"])
    return build_config(raw)


def build_config(raw: Mapping[Any, Any]) -> Config:
    """A :class:`Config` from an already parsed YAML mapping (all errors, or the config)."""
    top = dict(raw)
    registry_errors: list[str] = []
    registries = _registries(top.pop("registries", None), registry_errors)
    errors: list[str] = []
    config: Config | None = None
    try:
        config = _CONFIG.validate_python({**top, "registries": registries})
    except ValidationError as error:
        errors.extend(_format(error, ()))
    errors.extend(registry_errors)
    if config is not None and not registry_errors:
        errors.extend(_cross_checks(config))
    if errors or config is None:
        raise ConfigError(errors)
    return config


def _cross_checks(config: Config) -> list[str]:
    """Rules that span keys: hosts that requests are routed to must be allowed to be contacted;
    the bounds written must fit the memory budget."""
    errors = []
    hint = "give it a registries block or match it in allowedHosts"
    if not config.is_allowed(config.default_registry):
        errors.append(f'defaultRegistry: host "{config.default_registry}" is not allowed ({hint})')
    for alias, host in config.host_aliases.items():
        if not config.is_allowed(host):
            errors.append(f'hostAliases.{alias}: host "{host}" is not allowed ({hint})')
    budget = config.budget()
    if budget.over:
        written = ", ".join(f"{s.bound} {s.value}" for s in budget.shares if s.set)
        errors.append(
            f"limits.memory: the bounds written ({written}) need {budget.over} bytes more than "
            f"the budget of {budget.memory} bytes leaves them; lower them or raise limits.memory"
        )
    return errors


def _registries(raw: Any, errors: list[str]) -> dict[str, RegistrySettings]:
    """Effective settings per normalised host plus ``default``; problems go to ``errors``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(f"registries: must be a mapping of host to settings, not {_kind(raw)}")
        return {}
    default_raw = _block(raw.get(DEFAULT_BLOCK), f"registries.{DEFAULT_BLOCK}", errors)
    default_ok = default_raw is not None
    result: dict[str, RegistrySettings] = {}
    if default_raw is not None:
        for key in _HOST_ONLY_KEYS:
            if key in default_raw:
                errors.append(
                    f"registries.{DEFAULT_BLOCK}.{key}: not allowed in the default block "
                    "(it belongs to one host)"
                )
                default_ok = False
        settings = _validate(default_raw, ("registries", DEFAULT_BLOCK), errors)
        if settings is None:
            default_ok = False
        else:
            result[DEFAULT_BLOCK] = settings

    seen: dict[str, str] = {}
    for key, value in raw.items():
        if key == DEFAULT_BLOCK:
            continue
        where = f"registries.{key}"
        if not isinstance(key, str):
            errors.append(f"{where}: a host must be a string")
            continue
        try:
            host = validate_host(key)
        except ValueError as error:
            errors.append(f"{where}: {error}")
            continue
        if host in seen:
            # index.docker.io and docker.io are one registry with one budget.
            errors.append(f'{where}: the same host as "{seen[host]}"')
            continue
        seen[host] = key
        block = _block(value, where, errors)
        if block is None:
            continue
        # The host's own block alone first, so that its errors carry its own path; only a
        # valid block is merged, and the default's errors were reported once above.
        if _validate(block, ("registries", key), errors) is None or not default_ok:
            continue
        merged = _merge(default_raw or {}, block)
        settings = _validate(merged, ("registries", key), errors)
        if settings is not None:
            result[host] = settings
    return result


def _block(value: Any, where: str, errors: list[str]) -> dict[str, Any] | None:
    """A registry block with canonical (camelCase) keys; ``host:`` with no value is ``{}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"{where}: must be a mapping, not {_kind(value)}")
        return None
    return _canonical(value)


def _canonical(block: Mapping[Any, Any]) -> dict[Any, Any]:
    # Both spellings are accepted (max_hold, maxHold); merging needs one, or the default's
    # ``max_hold`` and the host's ``maxHold`` would both reach the model. Registry blocks have
    # no free-form keys, so every key can be rewritten.
    return {
        camel(key) if isinstance(key, str) else key: (
            _canonical(value) if isinstance(value, dict) else value
        )
        for key, value in block.items()
    }


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; nested mappings merge key by key, the rest is replaced."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict) and key not in _ATOMIC_KEYS:
            merged[key] = _merge(below, value)
        else:
            merged[key] = value
    return merged


def _validate(
    block: Mapping[str, Any], prefix: tuple[str, ...], errors: list[str]
) -> RegistrySettings | None:
    try:
        return _REGISTRY.validate_python(block)
    except ValidationError as error:
        errors.extend(_format(error, prefix))
        return None


def _format(error: ValidationError, prefix: tuple[str, ...]) -> list[str]:
    """One ``"path: reason"`` line per pydantic error, paths with the YAML key names."""
    lines = []
    for item in error.errors():
        loc = (*prefix, *item["loc"])
        nested = item.get("ctx", {}).get("error")
        if item["type"] == "value_error" and isinstance(nested, NestedErrors):
            # One model-level check, several problems each at its own path below the model.
            for sub, reason in nested.problems:
                lines.append(f"{format_path((*loc, *sub))}: {reason}")
            continue
        lines.append(f"{format_path(loc) or '<top level>'}: {_reason(item)}")
    return lines


def _reason(item: Any) -> str:
    kind = item["type"]
    if kind == "missing":
        return "required"
    if kind == "value_error":
        # Our own validators' messages, without pydantic's "Value error, " prefix.
        return str(item["ctx"]["error"])
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return "unknown key"
    if kind in ("dataclass_type", "dataclass_args_type", "model_type", "dict_type"):
        return f"must be a mapping, not {_kind(item['input'])}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, not {_kind(item['input'])}"
    return str(item["msg"])


def _kind(value: Any) -> str:
    """A YAML-ish name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _yaml_error(source: str, error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        problem = error.problem or "invalid YAML"
        return (
            f"{source}: invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        )
    return f"{source}: invalid YAML: {error}"
