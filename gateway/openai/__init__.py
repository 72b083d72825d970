"""The OpenAI-compatible surface: chat completions, completions, models."""
