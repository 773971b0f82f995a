"""The driver API structs nib passes through ctypes, checked against cuda.h's layout.

A wrong size or offset here is silent: the driver reads whatever lies there (a
launch attribute that is not set, a config field read from padding), so the
layout is pinned on the CPU.
"""

from __future__ import annotations

import ctypes

from nib.engine.cuda import driver


def test_launch_attribute_layout() -> None:
    attr = driver._LaunchAttribute
    assert ctypes.sizeof(attr) == 72  # id, pad to 8, 64-byte value union
    assert attr.value.offset == 8
    assert ctypes.sizeof(driver._LaunchAttributeValue) == 64


def test_launch_config_layout() -> None:
    cfg = driver._LaunchConfig
    assert ctypes.sizeof(cfg) == 56
    assert cfg.sharedMemBytes.offset == 24
    assert cfg.hStream.offset == 32
    assert cfg.attrs.offset == 40
    assert cfg.numAttrs.offset == 48


def test_pdl_attribute_is_set_in_its_own_buffer() -> None:
    attr = driver._pdl_attribute()
    raw = bytes(ctypes.string_at(ctypes.addressof(attr), ctypes.sizeof(attr)))
    assert int.from_bytes(raw[0:4], "little") == 6  # PROGRAMMATIC_STREAM_SERIALIZATION
    assert int.from_bytes(raw[8:12], "little") == 1  # allowed
    assert raw[12:] == bytes(60)
