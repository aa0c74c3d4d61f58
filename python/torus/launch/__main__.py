"""Entry point: `python3 -m torus.launch ...`, or `python3 path/to/torus/launch ...`.

Run as a directory, this file is imported with no package; it then loads its
own directory as the package `torus_launch`, so that neither torus/__init__.py
(torch, the extension) nor anything beside this directory is imported.
"""

import os
import sys

if __package__:
    from .cli import main
else:
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == _here:
        sys.path.pop(0)     # the directory itself is not a place to import top-level modules from
    _spec = importlib.util.spec_from_file_location("torus_launch", os.path.join(_here, "__init__.py"),
                                                   submodule_search_locations=[_here])
    _pkg = importlib.util.module_from_spec(_spec)
    sys.modules["torus_launch"] = _pkg
    _spec.loader.exec_module(_pkg)
    from torus_launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
