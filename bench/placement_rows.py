"""What a placement run left in its database, read before the database is dropped: versions with
their metrics, the trainer's ledger, completions (status, reasons, tokens), dropped sessions, and
the exported trajectories of every consumed session (through the gateway's own export API)."""

from __future__ import annotations

import httpx
import psycopg

from bench.placement_agents import Ledger
from bench.rlgw_process import RlgwServer
from rlgw.db.token_arrays import unpack_ids


def read_rows(gw: RlgwServer, model: str, ledger: Ledger) -> tuple[dict, dict[str, dict]]:
    with psycopg.connect(f"{gw.pg}/{gw.db}") as conn:
        model_id = conn.execute("SELECT id FROM models WHERE name = %s", (model,)).fetchone()[0]
        versions = [
            {"version": v, "kind": k, "created_at": c.timestamp(), "metrics": m}
            for v, k, c, m in conn.execute(
                "SELECT version, kind, created_at, metrics FROM policy_versions "
                "WHERE model_id = %s ORDER BY version",
                (model_id,),
            )
        ]
        consumption = [
            {"version": v, "session_id": s, "completion_id": c, "used": u, "tokens": t, "reason": r}
            for v, s, c, u, t, r in conn.execute(
                "SELECT version, session_id, completion_id, used, tokens, reason "
                "FROM consumption WHERE model_id = %s ORDER BY id",
                (model_id,),
            )
        ]
        completions = [
            {
                "id": i,
                "train": train,
                "status": status,
                "reasons": list(reasons),
                "orphan": orphan is not None,
                "output_tokens": len(unpack_ids(out)) if out is not None else 0,
                "created_at": created.timestamp(),
            }
            for i, train, status, reasons, orphan, out, created in conn.execute(
                "SELECT c.id, s.train, c.status, c.ineligible_reasons, c.orphan_reason, "
                "c.output_token_ids, c.created_at FROM completions c "
                "JOIN sessions s ON s.id = c.session_id"
            )
        ]
        dropped = dict(
            conn.execute(
                "SELECT coalesce(dropped_reason, '?'), count(*) FROM sessions "
                "WHERE status = 'dropped' GROUP BY 1"
            ).fetchall()
        )
    rows = {
        "versions": versions,
        "consumption": consumption,
        "completions": completions,
        "dropped_sessions": dropped,
    }
    consumed = sorted({c["session_id"] for c in consumption if c["used"]})
    exports = {}
    with httpx.Client(base_url=gw.url, timeout=60, trust_env=False) as http:
        for session_id in consumed:
            exports[session_id] = http.get(f"/v1/sessions/{session_id}/trajectory").json()
    return rows, exports
