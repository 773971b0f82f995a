"""Is a distribution's licence permissive? Decided from its metadata alone.

Evidence, in order of authority: the PEP 639 `License-Expression` (an SPDX
expression, parsed here), else the trove classifiers together with the free-text
`License` field. Anything copyleft (GPL, LGPL, AGPL, MPL, EPL, ...) or that we
cannot read is excluded: unknown is not permissive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# SPDX identifiers we accept: no copyleft, no field-of-use or advertising clauses.
PERMISSIVE_SPDX = frozenset(
    {
        "0BSD",
        "APACHE-2.0",
        "BSD-2-CLAUSE",
        "BSD-3-CLAUSE",
        "BSL-1.0",
        "CC0-1.0",
        "CNRI-PYTHON",
        "HPND",
        "ISC",
        "MIT",
        "MIT-0",
        "MIT-CMU",
        "NCSA",
        "PSF-2.0",
        "PYTHON-2.0",
        "PYTHON-2.0.1",
        "UNLICENSE",
        "UPL-1.0",
        "X11",
        "ZLIB",
    }
)

# Trove classifier suffix -> SPDX id (None: a classifier that names no licence by itself).
_CLASSIFIERS = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "BSD License": "BSD-3-Clause",
    "Apache Software License": "Apache-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "ISC License (ISCL)": "ISC",
    "The Unlicense (Unlicense)": "Unlicense",
    "zlib/libpng License": "Zlib",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "Universal Permissive License (UPL)": "UPL-1.0",
    "University of Illinois/NCSA Open Source License": "NCSA",
    "CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
}
_NEUTRAL_CLASSIFIERS = {"OSI Approved", "DFSG approved"}

# Free-text `License` fields as packages write them (lower-cased, punctuation squeezed).
_FREE_TEXT = [
    (r"^(the )?mit( license)?$", "MIT"),
    (r"^(new |modified |revised )?bsd( license)?$", "BSD-3-Clause"),
    (r"^bsd[ -]?3([ -]clause)?( license)?$", "BSD-3-Clause"),
    (r"^3[ -]clause bsd( license)?$", "BSD-3-Clause"),
    (r"^bsd[ -]?2([ -]clause)?( license)?$", "BSD-2-Clause"),
    (r"^2[ -]clause bsd( license)?$", "BSD-2-Clause"),
    (r"^apache( software)?( license)?,?( version)?[ -]?2(\.0)?( license)?$", "Apache-2.0"),
    (r"^apache software license$", "Apache-2.0"),
    (r"^(psf|python software foundation)( license)?([ -]2(\.0)?)?( license)?$", "PSF-2.0"),
    (r"^isc( license)?( \(iscl\))?$", "ISC"),
    (r"^(the )?unlicense$", "Unlicense"),
    (r"^zlib( license)?$", "Zlib"),
]
_COPYLEFT = re.compile(r"\b(a?gpl|lgpl|gnu|mpl|mozilla|epl|eclipse|cddl|eupl|osl|copyleft)\b")


class SpdxError(ValueError):
    """An SPDX expression that does not parse."""


@dataclass(frozen=True)
class LicenseVerdict:
    permissive: bool
    license: str  # what we read: an SPDX expression, ids joined by " AND ", or "unknown"
    evidence: str  # where it came from: License-Expression | classifiers | License | none
    reason: str = ""  # why it was excluded (empty when permissive)


def _tokens(expression: str) -> list[str]:
    return re.findall(r"\(|\)|[^\s()]+", expression)


def spdx_is_permissive(expression: str) -> bool:
    """Evaluate an SPDX expression: OR needs one permissive side, AND needs both.

    `X WITH exception` counts as X (the exceptions in use only widen permissions).
    """
    tokens = _tokens(expression)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise SpdxError(f"unexpected end of SPDX expression {expression!r}")
        pos += 1
        return tokens[pos - 1]

    def primary() -> bool:
        tok = take()
        if tok == "(":
            value = disjunction()
            if take() != ")":
                raise SpdxError(f"missing ')' in {expression!r}")
            return value
        if tok.upper() in ("AND", "OR", "WITH", ")"):
            raise SpdxError(f"unexpected {tok!r} in {expression!r}")
        if (peek() or "").upper() == "WITH":
            take()
            take()
        return tok.rstrip("+").upper() in PERMISSIVE_SPDX

    def conjunction() -> bool:
        value = primary()
        while (peek() or "").upper() == "AND":
            take()
            value = primary() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while (peek() or "").upper() == "OR":
            take()
            value = conjunction() or value
        return value

    if not tokens:
        raise SpdxError("empty SPDX expression")
    result = disjunction()
    if pos != len(tokens):
        raise SpdxError(f"trailing {tokens[pos]!r} in {expression!r}")
    return result


def free_text_license(text: str) -> str | None:
    """SPDX id for a free-text `License` field, or None when we cannot tell."""
    squeezed = re.sub(r"\s+", " ", text.strip().lower())
    if not squeezed or squeezed in ("unknown", "none", "n/a"):
        return None
    if _COPYLEFT.search(squeezed):
        return "copyleft"
    for pattern, spdx in _FREE_TEXT:
        if re.match(pattern, squeezed):
            return spdx
    try:  # some packages put an SPDX expression in the old field
        if spdx_is_permissive(text.strip()):
            return text.strip()
    except SpdxError:
        pass
    # The whole licence text pasted into the field: recognise the standard wordings.
    if "permission is hereby granted, free of charge" in squeezed:
        return "MIT"
    if "redistribution and use in source and binary forms" in squeezed:
        return "BSD-3-Clause"
    if "apache license" in squeezed and "version 2.0" in squeezed:
        return "Apache-2.0"
    return None


def classify(
    expression: str | None, classifiers: Iterable[str], license_text: str | None
) -> LicenseVerdict:
    """Decide from a distribution's metadata fields."""
    if expression and expression.strip():
        try:
            ok = spdx_is_permissive(expression)
        except SpdxError as exc:
            return LicenseVerdict(False, expression, "License-Expression", str(exc))
        reason = "" if ok else "License-Expression is not permissive"
        return LicenseVerdict(ok, expression.strip(), "License-Expression", reason)

    found: list[str] = []
    for c in classifiers:
        parts = [p.strip() for p in c.split("::")]
        if parts[0] != "License" or len(parts) < 2:
            continue
        name = parts[-1]
        if name in _NEUTRAL_CLASSIFIERS:
            continue
        found.append(_CLASSIFIERS.get(name, f"classifier:{name}"))
    text_id = free_text_license(license_text) if license_text else None
    ids = sorted({*found, *([text_id] if text_id else [])})
    evidence = "+".join(
        e for e, present in (("classifiers", found), ("License", text_id)) if present
    )
    if not ids:
        return LicenseVerdict(False, "unknown", "none", "no licence metadata")
    bad = [i for i in ids if not _permissive_id(i)]
    if bad:
        return LicenseVerdict(False, " AND ".join(ids), evidence, f"not permissive: {bad[0]}")
    return LicenseVerdict(True, " AND ".join(ids), evidence)


def _permissive_id(spdx: str) -> bool:
    try:
        return spdx_is_permissive(spdx)
    except SpdxError:
        return False
