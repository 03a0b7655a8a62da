"""``key=value`` argument parsing for the non-Hydra commands."""

from __future__ import annotations


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
