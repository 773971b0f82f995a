"""Build hook: every built wheel gets stubs generated from proto/ by grpcio-tools.

The stubs are also committed, so editable installs and plain checkouts work;
`make proto-check` (and tests/unit/test_proto_drift.py) fails when the
committed copies differ from what the generator writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from protogen import generate_stubs


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        generate_stubs(Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})
