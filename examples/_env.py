"""Settings shared by the examples, from environment variables.

RLGW_BASE_URL   the gateway (default http://127.0.0.1:8000); a session's base URL
                (http://host/sessions/<id>) records every call in that session
RLGW_MODEL      the model name registered in the gateway (default tiny-seed0)
RLGW_API_KEY    an agent key (`rlgw keys create --tenant local --quiet`); any text when auth is off
RLGW_EXTRA_BODY optional JSON object of extra request fields (e.g. sampling settings)
"""

from __future__ import annotations

import json
import os

BASE_URL = os.environ.get("RLGW_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
MODEL = os.environ.get("RLGW_MODEL", "tiny-seed0")
API_KEY = os.environ.get("RLGW_API_KEY", "unused")
EXTRA_BODY = json.loads(os.environ.get("RLGW_EXTRA_BODY") or "{}")
