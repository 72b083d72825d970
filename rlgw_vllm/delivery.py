"""Delivering a version to this host: a version file or a LoRA adapter read from the trainer's
path when it is here with the recorded sha256, else downloaded over HTTP in a thread
(rlgw_vllm/fetch.py) while the server keeps serving."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .staging import Staging


class Delivery(Staging):
    def rlgw_stage_url(
        self, url: str, sha256: str, kind: str, token: str, path: str = ""
    ) -> dict[str, Any]:
        """`rlgw_stage` of a version file fetched over HTTP (rlgw_vllm/fetch.py: bearer token,
        resumable, sha256 checked before a tensor is read), or read from `path` when that is a
        file on this host with the same sha256. The download runs in a thread: until it is done
        this answers {"pending": True, "received": bytes} at once (the trainer polls), so the
        server keeps serving meanwhile; then the stage starts (in its own thread: the answer
        says "running", and rlgw_stage_status tells the outcome). Says which delivery it used
        and why."""
        from .fetch import BackgroundFetch, file_digest

        t0 = time.perf_counter()
        done = self._rlgw_fetched
        thread = self._rlgw_stage_thread
        staging = self._rlgw_staged is not None or (thread is not None and thread.is_alive())
        if done is not None and done[0] == sha256.lower() and staging:
            return done[1]  # staged (or staging) already: another worker was still fetching
        fetch = self._rlgw_fetch
        if fetch is None or fetch.sha256 != sha256.lower():  # a new version: path or download?
            reason = "the trainer offered no path"
            if path:
                if not os.path.isfile(path):
                    reason = f"{path} is not readable on this host"
                elif file_digest(Path(path)) != sha256.lower():
                    reason = f"{path} on this host is another file (its sha256 differs)"
                else:
                    why = f"{path} on this host has the version's sha256"
                    staged = self.rlgw_stage(path, kind)
                    return {**staged, "delivery": "path", "delivery_reason": why, "downloaded": 0}
            fetch = self._rlgw_fetch = BackgroundFetch(url, token, sha256, reason)
        report: dict[str, Any] = {"delivery": "http", "delivery_reason": fetch.reason}
        if not fetch.done:
            return {"ok": True, "pending": True, "received": fetch.received(), **report}
        self._rlgw_fetch = None
        if fetch.result is None:
            return {"ok": False, "error": f"{fetch.reason}; fetching it: {fetch.error}", **report}
        fetched = fetch.result
        report["fetch"] = {
            "seconds": fetched.seconds,
            "resumed_from": fetched.resumed_from,
            "attempts": fetched.attempts,
        }
        staged = self.rlgw_stage(str(fetched.path), kind)
        result = {
            **staged,
            **report,
            "downloaded": fetched.bytes_downloaded,
            "seconds": time.perf_counter() - t0,
        }
        self._rlgw_fetched = (fetch.sha256, result) if staged.get("ok") else None
        return result

    def rlgw_fetch_adapter(
        self,
        config_url: str,
        config_sha256: str,
        weights_url: str,
        weights_sha256: str,
        token: str,
        path: str = "",
        keep: str = "",
    ) -> dict[str, Any]:
        """A LoRA adapter's folder on this host, for /v1/load_lora_adapter: the trainer's `path`
        when its two files are on this host with these sha256s, else both files downloaded
        (rlgw_vllm/fetch.py: bearer token, resumable, each sha256 checked before the folder is
        answered) into <downloads>/adapters/<weights sha256>/. The download runs in a thread:
        until it is done this answers {"pending": True, "received": bytes} at once (the trainer
        polls). `keep`: the folders the server has loaded, one a line; the other downloaded
        adapters are deleted once this one is in. Touches no weights; says which delivery."""
        from .fetch import BackgroundAdapterFetch, adapter_mismatch

        fetch = self._rlgw_adapter_fetch
        wanted = (config_sha256.lower(), weights_sha256.lower())
        if fetch is None or (fetch.config_sha256, fetch.sha256) != wanted:  # path or download?
            reason = "the trainer offered no path"
            if path:
                reason = adapter_mismatch(Path(path), config_sha256, weights_sha256) or ""
                if not reason:
                    why = f"{path} on this host has the version's sha256s"
                    report = {"delivery": "path", "delivery_reason": why, "downloaded": 0}
                    return {"ok": True, "folder": path, **report}
            fetch = self._rlgw_adapter_fetch = BackgroundAdapterFetch(
                (config_url, config_sha256),
                (weights_url, weights_sha256),
                token,
                reason,
                keep=[line for line in keep.splitlines() if line],
            )
        report: dict[str, Any] = {"delivery": "http", "delivery_reason": fetch.reason}
        if not fetch.done:
            return {"ok": True, "pending": True, "received": fetch.received(), **report}
        self._rlgw_adapter_fetch = None
        if fetch.result is None:
            return {"ok": False, "error": f"{fetch.reason}; fetching it: {fetch.error}", **report}
        fetched = fetch.result
        return {
            "ok": True,
            "folder": str(fetched.path),
            "downloaded": fetched.bytes_downloaded,
            "fetch": {
                "seconds": fetched.seconds,
                "resumed_from": fetched.resumed_from,
                "attempts": fetched.attempts,
            },
            **report,
        }
