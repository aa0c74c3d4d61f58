"""Imports torus-launch without torus/__init__.py (which needs torch and the
compiled extension): the package directory is loaded as `torus_launch`, the
way `python3 path/to/torus/launch` runs it. TORUS_LAUNCH_DIR picks another
copy (the build tree's)."""

import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH_DIR = os.environ.get("TORUS_LAUNCH_DIR") or os.path.join(REPO, "python", "torus", "launch")


def _load():
    if "torus_launch" not in sys.modules:
        spec = importlib.util.spec_from_file_location("torus_launch", os.path.join(LAUNCH_DIR, "__init__.py"),
                                                      submodule_search_locations=[LAUNCH_DIR])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["torus_launch"] = pkg
        spec.loader.exec_module(pkg)
    return sys.modules["torus_launch"]


_load()


@pytest.fixture
def run(capsys):
    """Runs the CLI in this process: (exit status, stdout, stderr)."""
    from torus_launch.cli import main

    def call(*argv):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
        out, err = capsys.readouterr()
        return rc, out, err

    return call
