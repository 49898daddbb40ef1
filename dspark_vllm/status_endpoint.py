"""`GET /dspark/status` on vLLM's own HTTP server (a `vllm.endpoint_plugins` entry point;
vLLM loads endpoint plugins only when named: run with VLLM_PLUGINS=dspark).

A small JSON view for humans: the cost table the budget is using, the latest budget,
calibration error per position, admitted/dropped/accepted counters and phase times.
"""

from __future__ import annotations

import json
import os


class StatusEndpoint:
    name = "dspark"
    required_tasks = None

    def attach_router(self, app) -> None:
        from fastapi.responses import JSONResponse

        from .metrics import METRICS_ENV

        @app.get("/dspark/status")
        async def dspark_status():  # noqa: ANN202 - FastAPI route
            path = os.environ.get(METRICS_ENV)
            if not path or not os.path.isfile(path):
                return JSONResponse({"error": "no DSpark load-aware budget is running in this "
                                              "server (enable_adaptive_verification is off)"},
                                    status_code=404)
            with open(path) as f:
                return JSONResponse(json.load(f))

    async def init_state(self, engine_client, state, args) -> None:
        return None


def endpoint_plugin() -> StatusEndpoint:
    return StatusEndpoint()
