"""Migration scripts, applied in order by Alembic."""
