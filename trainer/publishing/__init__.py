"""Versions and publishing: record a version with its ledger (publish), push it to the backends
(push), move the head back (rollback), the version files served to backends, and export."""
