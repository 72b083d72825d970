"""Settings fail fast on unsafe configuration."""

import pytest
from pydantic import ValidationError

from rlgw.settings import Settings


def test_default_admin_key_is_refused_on_a_public_bind():
    with pytest.raises(ValidationError, match="default admin key"):
        Settings(host="0.0.0.0")


def test_empty_admin_key_is_refused_on_a_public_bind():
    with pytest.raises(ValidationError, match="admin key"):
        Settings(host="10.1.2.3", admin_key="")


def test_loopback_bind_allows_the_default_key():
    assert Settings(host="127.0.0.1").admin_key


def test_plain_postgres_urls_get_the_psycopg_driver():
    assert Settings(database_url="postgres://u@h/db").database_url == "postgresql+psycopg://u@h/db"


def test_non_postgres_urls_are_refused():
    with pytest.raises(ValidationError):
        Settings(database_url="sqlite:///x.db")


SECRET = "x" * 40


def test_auth_off_is_refused_on_a_public_bind():
    with pytest.raises(ValidationError, match="RLGW_AUTH=off"):
        Settings(host="0.0.0.0", admin_key=SECRET, token_secret=SECRET, auth="off")


@pytest.mark.parametrize("secret", ["", "change-me-token-secret", "short-secret"])
def test_default_empty_or_short_token_secret_is_refused_on_a_public_bind(secret):
    with pytest.raises(ValidationError, match="token secret"):
        Settings(host="0.0.0.0", admin_key=SECRET, token_secret=secret)


def test_a_public_bind_with_real_secrets_starts_with_auth_on():
    settings = Settings(host="0.0.0.0", admin_key=SECRET, token_secret=SECRET)
    assert settings.auth == "on"


def test_auth_is_on_by_default_and_off_is_allowed_on_loopback():
    assert Settings().auth == "on"
    assert Settings(host="::1", auth="off").auth == "off"


def test_a_malformed_backend_allowlist_is_refused():
    with pytest.raises(ValidationError, match="allowlist entry"):
        Settings(backend_allowlist="10.0.0.0/99")


def test_reward_range_must_be_a_nonempty_interval():
    assert (Settings().reward_min, Settings().reward_max) == (-1e6, 1e6)
    with pytest.raises(ValidationError, match="RLGW_REWARD_MIN"):
        Settings(reward_min=1.0, reward_max=1.0)
    with pytest.raises(ValidationError):
        Settings(reward_max=float("inf"))
