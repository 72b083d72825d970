"""Who is calling: an agent key (a tenant), a session token (one session of a tenant), or nobody
in particular (RLGW_AUTH=off); and whether a presented admin key is the configured one. Routes
declare their caller as `CallerDep` (gateway/deps.py).

- Agent keys (`rlgw_ak_...`) are looked up by SHA-256 (rlgw/agent_keys.py); a replica caches a
  verified key for RLGW_AUTH_CACHE_S seconds (dropped at once when it revokes the key itself).
- Session tokens are HS256 JWTs signed with RLGW_TOKEN_SECRET (authlib's JOSE). They name one
  session, its tenant, the key that minted them and what they may do (`scp`); they expire, and
  revoking the minting key revokes them too.
- A session that is not the caller's tenant's is reported missing (404), exactly like a session
  that does not exist, so ids cannot be probed; a session token used elsewhere than its session
  gets the same 404, and 403 on routes that are not about a session.
"""

from __future__ import annotations

import hmac
import secrets
import time
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from authlib.deprecate import AuthlibDeprecationWarning  # noqa: E402  (installs its filter)
from fastapi import Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from rlgw.agent_keys import hash_key, looks_like_key
from rlgw.db.models import AgentKey
from rlgw.settings import Settings

from .errors import APIError, session_not_found

with warnings.catch_warnings():
    # authlib announces joserfc as the successor of authlib.jose, which the issue asks for and
    # whose API here is stable; silence that one notice, nothing else.
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    from authlib.jose import JsonWebToken
    from authlib.jose.errors import ExpiredTokenError, JoseError

# What a session token may do. A harness hands an agent a token that can complete and read;
# closing and rewarding stay with the harness unless it grants them.
SCOPES = ("completions", "read", "close", "rewards")
DEFAULT_TOKEN_SCOPES = ("completions", "read")
TOKEN_ISSUER = "rlgw"
TOKEN_AUDIENCE = "rlgw-session"


@dataclass(frozen=True)
class Caller:
    """The authenticated caller of one request."""

    kind: str  # "open" (auth off) | "key" | "token"
    tenant: str | None  # None only when auth is off: every session is reachable
    limit_key: str  # what rate and concurrency limits are counted against
    key_id: str | None = None
    session_id: str | None = None  # set for a session token: the one session it may touch
    scopes: frozenset[str] = field(default_factory=lambda: frozenset(SCOPES))

    def require_unscoped(self, action: str) -> None:
        """Routes that are not about one session: never with a session token."""
        if self.session_id is not None:
            raise APIError(
                403, f"a session token cannot {action}", code="session_token_not_allowed"
            )

    def require_session(self, session_id: str, scope: str) -> None:
        """A session token reaches its own session only, and only for what it was granted."""
        if self.session_id is None:
            return
        if session_id != self.session_id:
            raise session_not_found(session_id)
        if scope not in self.scopes:
            raise APIError(
                403, f"this session token does not grant {scope!r}", code="scope_not_granted"
            )


def tenant_sees(tenant: str | None, owner: str | None) -> bool:
    """Whether a caller of `tenant` sees a session or group owned by `owner`: every one with auth
    off (`tenant` None), else only its own tenant's (another tenant's session is reported missing,
    its group id unavailable)."""
    return tenant is None or owner == tenant


@dataclass(frozen=True)
class KeyInfo:
    id: str
    tenant: str


def admin_key_matches(presented: str | None, settings_key: str) -> bool:
    """Constant-time comparison; an empty configured key matches nothing."""
    if not presented or not settings_key:
        return False
    return hmac.compare_digest(presented.encode(), settings_key.encode())


def client_address(request: Request) -> str:
    return address_of(request.scope)


def address_of(scope: Any) -> str:
    """The client's host, as `request.client.host` gives it ("unknown" without one)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


def _unauthorized(message: str, code: str) -> APIError:
    return APIError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})


class AuthService:
    """Verifies agent keys and session tokens; mints session tokens. One per gateway process."""

    def __init__(self, settings: Settings, db_sessions: async_sessionmaker) -> None:
        self.enabled = settings.auth == "on"
        self.cache_s = settings.auth_cache_s
        self.max_ttl_s = settings.session_token_max_ttl_s
        # Only loopback binds may have the default secret (Settings refuses it elsewhere): it is
        # public, so this process signs with a random secret of its own instead.
        self.ephemeral_secret = settings.token_secret_unset
        self._secret = (
            secrets.token_bytes(32) if self.ephemeral_secret else settings.token_secret.encode()
        )
        self._jwt = JsonWebToken(["HS256"])
        self._db_sessions = db_sessions
        self._by_hash: dict[str, tuple[float, KeyInfo]] = {}
        self._by_id: dict[str, tuple[float, KeyInfo]] = {}

    # ------------------------------------------------------------------ keys

    def _cached(self, table: dict[str, tuple[float, KeyInfo]], key: str) -> KeyInfo | None:
        hit = table.get(key)
        if hit is not None and time.monotonic() < hit[0]:
            return hit[1]
        table.pop(key, None)
        return None

    def _remember(self, key_hash: str, info: KeyInfo) -> None:
        if self.cache_s <= 0:
            return
        if len(self._by_hash) > 100_000:  # bounded: verified keys only, and only for seconds
            self._by_hash.clear()
            self._by_id.clear()
        until = time.monotonic() + self.cache_s
        self._by_hash[key_hash] = (until, info)
        self._by_id[info.id] = (until, info)

    def forget(self, key_id: str) -> None:
        """Drop a revoked key from this replica's cache at once."""
        self._by_id.pop(key_id, None)
        for digest in [h for h, (_, info) in self._by_hash.items() if info.id == key_id]:
            self._by_hash.pop(digest, None)

    async def _load(self, *conditions: Any) -> KeyInfo | None:
        async with self._db_sessions() as db:
            row = (
                await db.execute(
                    select(AgentKey.id, AgentKey.tenant, AgentKey.key_hash).where(
                        *conditions, AgentKey.revoked_at.is_(None)
                    )
                )
            ).first()
        if row is None:
            return None
        info = KeyInfo(row.id, row.tenant)
        self._remember(row.key_hash, info)
        return info

    async def key_by_hash(self, key_hash: str) -> KeyInfo | None:
        return self._cached(self._by_hash, key_hash) or await self._load(
            AgentKey.key_hash == key_hash
        )

    async def key_by_id(self, key_id: str) -> KeyInfo | None:
        return self._cached(self._by_id, key_id) or await self._load(AgentKey.id == key_id)

    # ------------------------------------------------------------------ tokens

    def mint_token(
        self, caller: Caller, session_id: str, ttl_s: int, scopes: tuple[str, ...]
    ) -> tuple[str, datetime]:
        now = int(time.time())
        expires = now + ttl_s
        claims = {
            "iss": TOKEN_ISSUER,
            "aud": TOKEN_AUDIENCE,
            "sub": session_id,
            "ten": caller.tenant,
            "kid": caller.key_id,
            "scp": sorted(set(scopes)),
            "iat": now,
            "exp": expires,
            "jti": uuid.uuid4().hex,
        }
        token = self._jwt.encode({"alg": "HS256", "typ": "JWT"}, claims, self._secret)
        return token.decode(), datetime.fromtimestamp(expires, UTC)

    async def _verify_token(self, token: str) -> Caller:
        try:
            claims = self._jwt.decode(
                token,
                self._secret,
                claims_options={
                    "iss": {"essential": True, "value": TOKEN_ISSUER},
                    "aud": {"essential": True, "value": TOKEN_AUDIENCE},
                    "sub": {"essential": True},
                    "exp": {"essential": True},
                },
            )
            claims.validate(now=int(time.time()), leeway=0)
        except ExpiredTokenError:
            raise _unauthorized("the session token has expired", "token_expired") from None
        except (JoseError, ValueError, TypeError):
            raise _unauthorized("invalid credentials", "invalid_credentials") from None
        session_id, tenant, key_id, scopes = (
            claims.get("sub"),
            claims.get("ten"),
            claims.get("kid"),
            claims.get("scp"),
        )
        if not (
            isinstance(session_id, str)
            and isinstance(tenant, str)
            and isinstance(key_id, str)
            and isinstance(scopes, list)
            and all(s in SCOPES for s in scopes)
        ):
            raise _unauthorized("invalid credentials", "invalid_credentials")
        key = await self.key_by_id(key_id)
        if key is None or key.tenant != tenant:  # revoking a key revokes its tokens
            raise _unauthorized("the key that minted this token was revoked", "key_revoked")
        return Caller(
            kind="token",
            tenant=tenant,
            limit_key=f"key:{key_id}",
            key_id=key_id,
            session_id=session_id,
            scopes=frozenset(scopes),
        )

    async def identify(self, credential: str | None, sent_as: str, address: str) -> Caller:
        """The caller presenting `credential` (sent as `sent_as`, for the error message). With
        auth off anyone may call, limited by client `address`."""
        if not self.enabled:
            return Caller(kind="open", tenant=None, limit_key=f"addr:{address}")
        if not credential or not credential.strip():
            raise _unauthorized(
                f"an agent key or session token is required ({sent_as})", "missing_credentials"
            )
        return await self.verify(credential.strip())

    async def verify(self, credential: str) -> Caller:
        if looks_like_key(credential):
            key = await self.key_by_hash(hash_key(credential))
            if key is None:
                raise _unauthorized("invalid credentials", "invalid_credentials")
            return Caller(kind="key", tenant=key.tenant, limit_key=f"key:{key.id}", key_id=key.id)
        if credential.count(".") == 2 and len(credential) <= 4096:
            return await self._verify_token(credential)
        raise _unauthorized("invalid credentials", "invalid_credentials")
