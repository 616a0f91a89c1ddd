"""Turns YAML presets and `--set` overrides into a typed `Config`, collecting every problem.

Nothing is silently defaulted or coerced: an unknown key, a value of the wrong type or an
unparseable override is an error, and all errors are reported together in one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from fastrl.config.schema import Config


class ConfigError(Exception):
    """Every problem found in a configuration, one message each."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"  - {p}" for p in self.problems))


def _sections(cfg: Config) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _field_types(section_obj: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(type(section_obj))
    return {f.name: hints[f.name] for f in dataclasses.fields(section_obj)}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise ValueError saying why it is not one.

    Only lossless, unsurprising conversions: an int where a float is wanted, and a numeric
    string for a float (YAML 1.1 reads `1e-4` as a string, a classic trap).
    """
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a)
            except ValueError:
                pass
        raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"expected a bool (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+", value.strip()):
            value = float(value)  # YAML 1.1 reads `1e7` as a string; scientific notation is meant
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {value!r}")
    if tp is list or origin is list:
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return list(value)
        raise ValueError(f"expected a list of ints, got {value!r}")
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ValueError(f"expected a mapping, got {value!r}")
    raise ValueError(f"unsupported type {tp}")


def apply_mapping(cfg: Config, data: Any, origin: str, problems: list[str]) -> None:
    """Apply a nested {section: {key: value}} mapping onto cfg, appending problems."""
    if data is None:
        return
    if not isinstance(data, dict):
        problems.append(f"{origin}: expected a mapping of sections, got {type(data).__name__}")
        return
    sections = _sections(cfg)
    for section_name, values in data.items():
        if section_name not in sections:
            problems.append(f"{origin}: unknown section '{section_name}' (known: {', '.join(sections)})")
            continue
        if not isinstance(values, dict):
            problems.append(f"{origin}: section '{section_name}' must be a mapping")
            continue
        for key, value in values.items():
            set_value(cfg, f"{section_name}.{key}", value, origin, problems)


@dataclasses.dataclass(frozen=True)
class RetiredKey:
    """A key that no longer exists: the keys that replaced it, what a refusal tells the user, and how its
    old value reads in the new keys (a saved config.json carries it over, so resuming keeps its meaning)."""
    replaced_by: tuple[str, ...]
    how: str
    old_to_new: typing.Callable[[Any], Any] = lambda value: value


# a saved config.json that names one resumes with its old meaning; a preset or --set that names it is refused
RETIRED_KEYS = {
    "system.sampler_nice": RetiredKey(
        ("system.rollout_nice", "system.inference_nice"),
        "it was split into system.rollout_nice and system.inference_nice (set each to the old value for its old meaning)"),
    "system.rollout_sched_batch": RetiredKey(
        ("system.rollout_sched_policy",),
        "system.rollout_sched_policy replaced it (true is 'batch', false 'normal')",
        lambda value: "batch" if value is True else "normal" if value is False else value),
}


# keys whose default changes what an older run's model is: a saved config.json without one predates it, and
# resumes (or is evaluated) with the value that keeps the model it trained
ADDED_KEYS = {
    "env.joint_actions": False,  # before it, several discrete choices had one categorical each
}


def _migrate_saved(saved: dict) -> dict:
    """A run saved before a key was retired, or added, resumes with its old meaning."""
    saved = {section: dict(values) if isinstance(values, dict) else values for section, values in saved.items()}
    for added, old_value in ADDED_KEYS.items():
        section, _, key = added.partition(".")
        if isinstance(saved.get(section), dict):
            saved[section].setdefault(key, old_value)
    for old, retired in RETIRED_KEYS.items():
        section, _, key = old.partition(".")
        values = saved.get(section)
        if isinstance(values, dict) and key in values:
            value = retired.old_to_new(values.pop(key))
            for new in retired.replaced_by:
                new_section, _, new_key = new.partition(".")
                saved.setdefault(new_section, {}).setdefault(new_key, value)
    return saved


def set_value(cfg: Config, dotted_key: str, value: Any, origin: str, problems: list[str]) -> None:
    section_name, _, key = dotted_key.partition(".")
    sections = _sections(cfg)
    if section_name not in sections or not key:
        problems.append(f"{origin}: unknown key '{dotted_key}' (keys look like section.name; sections: {', '.join(sections)})")
        return
    section = sections[section_name]
    types = _field_types(section)
    if dotted_key in RETIRED_KEYS:
        problems.append(f"{origin}: '{dotted_key}' is no longer a setting: {RETIRED_KEYS[dotted_key].how}")
        return
    if key not in types:
        import difflib

        close = difflib.get_close_matches(key, list(types), n=3)
        hint = f"; did you mean {', '.join(section_name + '.' + c for c in close)}?" if close else ""
        problems.append(f"{origin}: unknown key '{dotted_key}'{hint}")
        return
    try:
        setattr(section, key, coerce(value, types[key]))
    except ValueError as e:
        problems.append(f"{origin}: {dotted_key}: {e}")


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key, _, raw = text.partition("=")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def load_config(path: str | Path | list | None = None, overrides: list[str] = (), saved: dict | None = None) -> Config:
    """Build a Config from defaults, a saved config.json mapping or YAML files, then `--set` overrides.

    Several YAML files apply in order, later over earlier: a preset, then an overlay such as the
    one `fastrl tune` writes.
    """
    cfg = Config()
    problems: list[str] = []
    if saved is not None:
        apply_mapping(cfg, _migrate_saved(saved), "saved config.json", problems)
    paths = [] if path is None else list(path) if isinstance(path, (list, tuple)) else [path]
    for p in map(Path, paths):
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            problems.append(f"config file not found: {p}")
            data = None
        except yaml.YAMLError as e:
            problems.append(f"{p}: not valid YAML: {e}")
            data = None
        apply_mapping(cfg, data, str(p), problems)
    for text in overrides:
        try:
            key, value = parse_override(text)
        except (ValueError, yaml.YAMLError) as e:
            problems.append(f"--set {text}: {e}")
            continue
        set_value(cfg, key, value, f"--set {text}", problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict) -> Config:
    return load_config(saved=data)


def describe_config() -> str:
    """Every key with its type, default and help, for `fastrl train --help-config`."""
    lines = []
    for section_name, section in _sections(Config()).items():
        lines.append(f"[{section_name}]")
        types = _field_types(section)
        for f in dataclasses.fields(section):
            lines.append(f"  {section_name}.{f.name} ({_type_name(types[f.name])}, default {getattr(section, f.name)!r})")
            lines.append(f"      {f.metadata.get('help', '')}")
    return "\n".join(lines)
