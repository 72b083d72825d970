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
