"""The gateway: OpenAI-compatible proxy, session and reward API, admin API, routing, recording."""
