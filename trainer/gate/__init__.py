"""The promotion gate: what a new version must pass before it serves all traffic."""
