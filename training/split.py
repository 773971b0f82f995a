"""The held-out split: whole units, chosen by a salted hash, never by line or file.

The order of units is sha256(salt + ":" + unit), so it does not depend on the
machine, the file system or Python's hash seed; the same corpus always gives
the same split. Big units are never held out, so one package cannot swallow the
held-out share, and the held-out set stays a spread of many small ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


class SplitError(ValueError):
    """The corpus cannot be split as asked (too few units, or nothing eligible)."""


def stable_key(salt: str, name: str) -> str:
    return hashlib.sha256(f"{salt}:{name}".encode()).hexdigest()


def choose_heldout(
    unit_bytes: Mapping[str, int], fraction: float, max_unit_fraction: float, salt: str
) -> set[str]:
    """Units to hold out: in hash order, skipping big ones, until `fraction` of the bytes.

    At least one unit is held out and at least one kept for training.
    """
    if not 0 < fraction < 1:
        raise SplitError(f"heldout_fraction must be in (0, 1), got {fraction}")
    if len(unit_bytes) < 2:
        raise SplitError(f"need at least 2 units to split, found {len(unit_bytes)}")
    total = sum(unit_bytes.values())
    target, limit = fraction * total, max_unit_fraction * total
    chosen: set[str] = set()
    held = 0
    for unit in sorted(unit_bytes, key=lambda u: stable_key(salt, u)):
        if held >= target:
            break
        size = unit_bytes[unit]
        if size > limit or held + size > 1.5 * target:
            continue
        chosen.add(unit)
        held += size
    if not chosen:
        raise SplitError(
            f"no unit is small enough to hold out (max_unit_fraction={max_unit_fraction}, "
            f"smallest unit {min(unit_bytes.values())} of {total} bytes)"
        )
    if len(chosen) == len(unit_bytes):
        raise SplitError("every unit was held out: raise the corpus size or lower the fraction")
    return chosen
