"""The bridge's settings, from initializationOptions and workspace/didChangeConfiguration.

Editors send them in one of two shapes, both accepted: the settings object
itself (`{"address": ...}`), or wrapped in a section (`{"nib": {"address": ...}}`).
Keys are camelCase, as editors' JSON settings are. An unknown key or a bad
value is reported (window/showMessage) and the previous value kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["auto", "single", "multi"]
SECTION = "nib"


@dataclass(frozen=True)
class BridgeSettings:
    address: str = "127.0.0.1:50051"
    api_key: str | None = None
    tls: bool = False
    ca_file: str | None = None
    # Most tokens one completion may generate (multi-line; single-line stops at the newline).
    max_tokens: int = 128
    # Quiet time after a keystroke before a completion is requested; keystrokes
    # inside it produce one request, not one per key. 0 disables it.
    debounce_ms: int = 100
    # single: finish the current line; multi: the rest of the block; auto: single when
    # there is text right of the cursor, multi otherwise.
    mode: Mode = "auto"
    # Prompt budget (prefix + suffix) in tokens, capped by what the model's context allows.
    prompt_tokens: int = 1024
    # Share of the prompt budget the text before the cursor gets (the rest: after it).
    prefix_share: float = 0.75
    temperature: float = 0.0
    # Deadline of one completion in seconds.
    timeout_s: float = 10.0

    def replace(self, **changes: Any) -> BridgeSettings:
        return dataclasses.replace(self, **changes)


# camelCase key -> (field, type check, rule for the error message)
_KEYS: dict[str, tuple[str, Any, str]] = {
    "address": ("address", lambda v: isinstance(v, str) and ":" in v, "host:port"),
    "apiKey": ("api_key", lambda v: v is None or (isinstance(v, str) and v.isprintable()), "text"),
    "tls": ("tls", lambda v: isinstance(v, bool), "true or false"),
    "caFile": ("ca_file", lambda v: v is None or isinstance(v, str), "a file path"),
    "maxTokens": ("max_tokens", lambda v: _int(v) and 1 <= v <= 4096, "1 to 4096"),
    "debounceMs": ("debounce_ms", lambda v: _int(v) and 0 <= v <= 5000, "0 to 5000"),
    "mode": ("mode", lambda v: v in ("auto", "single", "multi"), '"auto", "single" or "multi"'),
    "promptTokens": ("prompt_tokens", lambda v: _int(v) and 16 <= v <= 1 << 20, "16 or more"),
    "prefixShare": ("prefix_share", lambda v: _num(v) and 0.0 < v < 1.0, "between 0 and 1"),
    "temperature": ("temperature", lambda v: _num(v) and 0.0 <= v <= 2.0, "0 to 2"),
    "timeoutS": ("timeout_s", lambda v: _num(v) and 0.0 < v <= 600, "0 to 600 seconds"),
}


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def section_of(raw: object) -> Mapping[str, Any] | None:
    """The settings object in either accepted shape, or None if there is none."""
    if not isinstance(raw, Mapping):
        return None
    inner = raw.get(SECTION)
    return inner if isinstance(inner, Mapping) else raw


def apply(settings: BridgeSettings, raw: object) -> tuple[BridgeSettings, list[str]]:
    """`settings` updated from `raw`; the problems found, one message per key."""
    values = section_of(raw)
    if values is None:
        return settings, []
    changes: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        if key not in _KEYS:
            problems.append(f"unknown setting {key!r} (known: {', '.join(sorted(_KEYS))})")
            continue
        field, valid, rule = _KEYS[key]
        if not valid(value):
            problems.append(f"setting {key} is {value!r}; it must be {rule}")
            continue
        changes[field] = (
            float(value) if field in ("prefix_share", "temperature", "timeout_s") else value
        )
    return settings.replace(**changes), problems
