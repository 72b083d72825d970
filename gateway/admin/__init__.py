"""Admin API: every route requires the admin key."""
