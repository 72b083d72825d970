"""The proxy core the three API surfaces share: routing to backends, relaying, recording calls."""
