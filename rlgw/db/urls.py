"""Database URLs in the two spellings the code needs: SQLAlchemy's (with the psycopg 3 driver)
and libpq's (for psycopg.connect and LISTEN connections)."""

from __future__ import annotations


def to_sqlalchemy_url(uri: str) -> str:
    """postgresql://... -> postgresql+psycopg://... (psycopg 3 driver)."""
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


def to_libpq_uri(url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... for psycopg.connect()."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
