"""The formats of the ids callers choose or send back: sessions and groups, and completions."""

from __future__ import annotations

# A session id (its own, or given by the caller) and a group id: 1-128 characters.
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
GROUP_ID_PATTERN = SESSION_ID_PATTERN
# A completion id as the gateway returns it (`chatcmpl-<hex>`, `<id>-<i>` for sibling choices).
COMPLETION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
