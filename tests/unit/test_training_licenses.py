"""The corpus keeps permissively licensed distributions only, read from their metadata."""

from __future__ import annotations

import pytest

from training.licenses import SpdxError, classify, free_text_license, spdx_is_permissive


@pytest.mark.parametrize(
    ("expression", "permissive"),
    [
        ("MIT", True),
        ("Apache-2.0 OR BSD-2-Clause", True),
        ("BSD-3-Clause AND 0BSD AND MIT AND Zlib AND CC0-1.0", True),  # numpy
        ("Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND BSD-3-Clause", True),  # torch
        ("MIT OR GPL-3.0-only", True),  # a dual licence: we take the permissive side
        ("MIT AND GPL-3.0-only", False),
        ("MPL-2.0", False),
        ("LGPL-2.1-or-later", False),
        ("(MIT OR GPL-2.0) AND BSD-3-Clause", True),
        ("MIT AND (GPL-2.0 OR LGPL-3.0)", False),
        ("LicenseRef-Proprietary", False),
        ("apache-2.0", True),  # identifiers are case-insensitive
    ],
)
def test_spdx_expressions(expression: str, permissive: bool) -> None:
    assert spdx_is_permissive(expression) is permissive


@pytest.mark.parametrize(
    "bad", ["", "MIT AND", "(MIT", "MIT)", "AND MIT", "MIT OR OR BSD-3-Clause"]
)
def test_malformed_spdx_is_an_error(bad: str) -> None:
    with pytest.raises(SpdxError):
        spdx_is_permissive(bad)


@pytest.mark.parametrize(
    ("text", "spdx"),
    [
        ("MIT", "MIT"),
        ("MIT License", "MIT"),
        ("BSD", "BSD-3-Clause"),
        ("3-Clause BSD License", "BSD-3-Clause"),  # protobuf
        ("BSD-3", "BSD-3-Clause"),
        ("Apache 2.0 License", "Apache-2.0"),  # transformers
        ("Apache License, Version 2.0", "Apache-2.0"),
        ("ISC License", "ISC"),
        ("PSF", "PSF-2.0"),
        ("MPL-2.0 AND MIT", "copyleft"),  # tqdm
        ("GNU General Public License v3", "copyleft"),
        ("LGPL", "copyleft"),
        ("UNKNOWN", None),
        ("Proprietary", None),
        ("Permission is hereby granted, free of charge, to any person obtaining a copy", "MIT"),
    ],
)
def test_free_text_license_field(text: str, spdx: str | None) -> None:
    assert free_text_license(text) == spdx


def test_license_expression_wins_over_classifiers() -> None:
    v = classify("MPL-2.0", ["License :: OSI Approved :: MIT License"], "MIT")
    assert not v.permissive and v.evidence == "License-Expression"


def test_classifiers_and_text_must_all_be_permissive() -> None:
    ok = classify(None, ["License :: OSI Approved :: BSD License"], "BSD")
    assert ok.permissive and ok.license == "BSD-3-Clause"
    mixed = classify(
        None,
        [
            "License :: OSI Approved :: MIT License",
            "License :: OSI Approved :: GNU General Public License v2 (GPLv2)",
        ],
        None,
    )
    assert not mixed.permissive and "GNU General Public License" in mixed.reason


def test_unknown_licence_is_excluded() -> None:
    v = classify(None, ["License :: OSI Approved"], "")
    assert not v.permissive and v.reason == "no licence metadata"
    assert not classify(None, ["License :: Other/Proprietary License"], None).permissive
