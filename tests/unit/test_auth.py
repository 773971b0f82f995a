"""API key file parsing and lookup; errors name the line, never the key."""

from __future__ import annotations

import pytest

from nib.service.auth import ApiKeys, KeyFileError, bearer_token, is_open

KEY_A = "a" * 16 + "-alpha-key"
KEY_B = "b" * 20
KEY_A2 = "rotated:key:with:colons"


def test_parse_and_lookup() -> None:
    keys = ApiKeys.parse(f"# comment\n\nacme:{KEY_A}\nglobex : {KEY_B}\nacme:{KEY_A2}\n")
    assert keys.tenants == {"acme", "globex"}
    assert keys.tenant_of(KEY_A) == "acme"
    assert keys.tenant_of(KEY_A2) == "acme"  # several keys per tenant; ':' allowed in keys
    assert keys.tenant_of(KEY_B) == "globex"
    assert keys.tenant_of(KEY_A + "x") is None
    assert keys.tenant_of("") is None
    assert KEY_A not in repr(keys)  # only digests are kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no keys"),
        ("# only a comment\n", "no keys"),
        (f"acme {KEY_A}", "line 1: expected tenant:key"),
        (f"\n-bad:{KEY_A}", "line 2: tenant must be"),
        (f"{'t' * 65}:{KEY_A}", "line 1: tenant must be"),
        ("acme:short", "line 1: key must be 16-256 visible ASCII"),
        ("acme:has a space in the key", "line 1: key must be"),
        (f"acme:{KEY_A}\nother:{KEY_A}", "line 2: this key is already listed"),
    ],
)
def test_bad_files_name_the_line_not_the_key(text: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message) as info:
        ApiKeys.parse(text)
    assert KEY_A not in str(info.value)


def test_bearer_token_from_metadata() -> None:
    assert bearer_token((("authorization", f"Bearer {KEY_A}"),)) == KEY_A
    assert bearer_token((("x", "y"), ("authorization", f"bearer  {KEY_A} "))) == KEY_A
    assert bearer_token((("authorization", f"Basic {KEY_A}"),)) is None
    assert bearer_token((("authorization", "Bearer "),)) is None
    assert bearer_token(()) is None
    assert bearer_token(None) is None


def test_health_and_reflection_are_open() -> None:
    assert is_open("/grpc.health.v1.Health/Check")
    assert is_open("/grpc.health.v1.Health/Watch")
    assert is_open("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    assert is_open("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
    assert not is_open("/nib.v1.CompletionService/Complete")
    assert not is_open("/nib.v1.CompletionService/GetModelInfo")
