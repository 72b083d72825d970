"""Anthropic Messages API surface: translated to the recorded chat path."""
