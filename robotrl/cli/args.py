"""``key=value`` argument parsing for the non-Hydra commands."""

from __future__ import annotations

from typing import Any


def parse_kv(argv: list[str], allowed: dict[str, type]) -> dict[str, object]:
    """``key=value`` arguments typed by ``allowed``; a bad key names the allowed ones."""
    out: dict[str, object] = {}
    for arg in argv:
        if "=" not in arg:
            raise SystemExit(f"expected key=value, got {arg!r}; allowed keys: {sorted(allowed)}")
        key, value = arg.split("=", 1)
        if key not in allowed:
            raise SystemExit(f"unknown key {key!r}; allowed keys: {sorted(allowed)}")
        kind = allowed[key]
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                out[key] = value.lower() in ("true", "1", "yes")
            else:
                out[key] = kind(value)
        except ValueError:
            raise SystemExit(f"{key}={value!r} is not a valid {kind.__name__}") from None
    return out


def split_options(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``options.KEY=VALUE`` arguments (task options; VALUE parsed as YAML) as ``{KEY: VALUE}``,
    and the other arguments."""
    import yaml

    out: dict[str, Any] = {}
    for arg in argv:
        if not arg.startswith("options."):
            continue
        key, sep, value = arg.removeprefix("options.").partition("=")
        if not sep or not key:
            raise SystemExit(f"error: expected options.KEY=VALUE, got {arg!r}")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise SystemExit(f"error: {arg}: not a YAML value ({err})") from None
    return out, [a for a in argv if not a.startswith("options.")]
