"""The vLLM control endpoints a swap uses (dev mode), and the project's worker-extension calls."""

from __future__ import annotations

from typing import Any

import httpx


class ControlError(RuntimeError):
    """A control call failed or a worker refused an operation."""


class VllmControl:
    def __init__(self, http: httpx.Client, url: str) -> None:
        self.http = http
        self.url = url.rstrip("/")

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        reply = self.http.post(self.url + path, **kwargs)
        if reply.status_code != 200:
            raise ControlError(f"POST {path}: HTTP {reply.status_code} {reply.text[:300]}")
        return reply

    def post_json(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """POST a JSON body (or none) to a control route; ControlError unless it answers 200."""
        return self._post(path, json=body)

    def pause(self, mode: str) -> None:
        """mode 'keep' holds the running requests in the engine (a swap then records where it
        cut each one: trainer/swap/boundary.py); 'wait' lets them finish; 'abort' ends them."""
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"unknown pause mode {mode!r}")
        self._post("/pause", params={"mode": mode})

    def resume(self) -> None:
        self._post("/resume")

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (GPU: level 1 moves the weights to host memory and frees the KV
        cache; level 2 drops both). It pauses the engine first, keeping the running requests
        (recomputed on wake-up; none is cut); on the CPU build that pause is all it does."""
        self._post("/sleep", params={"level": level, "mode": "keep"})

    def wake_up(self) -> None:
        self._post("/wake_up")

    def reset_prefix_cache(self, *, running: bool = False) -> None:
        """Drop the cached KV blocks (computed with the old weights); with `running`, preempt the
        running requests too, so that each recomputes its prefix when it is next scheduled."""
        params = {"reset_running_requests": "true"} if running else None
        self._post("/reset_prefix_cache", params=params)

    def weight_version(self) -> str:
        reply = self.http.get(self.url + "/weight_info")
        reply.raise_for_status()
        return str(reply.json().get("weight_version"))

    def set_weight_version(self, label: str) -> None:
        self._post("/update_weight_version", json={"new_version": label})

    def served_models(self) -> list[str]:
        """The names the server answers to: its model and every LoRA adapter loaded."""
        reply = self.http.get(self.url + "/v1/models")
        reply.raise_for_status()
        return [str(m.get("id")) for m in reply.json().get("data", []) if isinstance(m, dict)]

    def load_lora_adapter(self, name: str, path: str) -> str:
        """Load (vLLM validates and preloads it) the peft adapter at `path` as model `name`."""
        return self._post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}).text

    def unload_lora_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", json={"lora_name": name})

    def requests_in_flight(self) -> float:
        """Running plus waiting requests, from vLLM's Prometheus metrics."""
        reply = self.http.get(self.url + "/metrics")
        reply.raise_for_status()
        total = 0.0
        for line in reply.text.splitlines():
            if line.startswith(
                (
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting{",
                    "vllm:num_requests_waiting ",
                )
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def rpc(self, method: str, **kwargs: str) -> Any:
        """Call a worker-extension method on every worker; each must report ok."""
        reply = self._post("/collective_rpc", json={"method": method, "kwargs": kwargs})
        results = reply.json().get("results", [])
        for result in results:
            if isinstance(result, dict) and not result.get("ok", True):
                raise ControlError(f"{method}: {result.get('error')}")
        return results
