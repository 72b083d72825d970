"""OpenAI Responses API surface: translated to the recorded chat path."""
