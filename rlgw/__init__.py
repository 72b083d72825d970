"""rlgw package."""
