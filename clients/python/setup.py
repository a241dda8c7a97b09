"""Build hook: generate the gRPC stubs before setuptools copies the package.

Everything else about the package is in pyproject.toml. This runs for
`pip install .`, `pip install -e .` and `python -m build --wheel` alike;
grpcio-tools comes from pyproject's [build-system] requires.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate_stubs  # noqa: E402  (found through the line above)


class BuildPyWithStubs(build_py):
    def run(self):
        generate_stubs.generate_for_build()
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
