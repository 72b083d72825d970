"""Governance of what may change a model: consent, audit, rollbacks, purge and retention."""
