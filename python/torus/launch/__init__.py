"""torus-launch: render and check launches of torus-train on Slurm and
Kubernetes (docs/launch.md). Needs PyYAML and jsonschema only: neither torch
nor the compiled extension, so `python3 path/to/torus/launch` runs it from a
source or build tree.
"""
