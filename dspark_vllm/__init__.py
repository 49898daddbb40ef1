"""dspark-vllm: DSpark speculative decoding for vLLM's V1 model runner.

Importing the package is cheap: everything heavy (torch, vLLM) loads lazily, because
vLLM imports the plugin entry point in every process it starts.
"""

__version__ = "0.1.0"


def register() -> None:
    """vLLM `general_plugins` entry point (lazy, idempotent)."""
    from .plugin import register as _register

    _register()
