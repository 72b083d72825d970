"""Shared by the compatibility tests (chat, Responses, Messages, agent stacks)."""

from __future__ import annotations

# Strict tool schemas are enforced by vLLM's grammar, but JSON allows whitespace anywhere and the
# tiny random model pads with it forever; tests that need a finished tool call forbid whitespace
# (tab, newline, carriage return, space) with logit_bias, a pass-through sampling field.
NO_WHITESPACE = {"9": -100, "10": -100, "13": -100, "32": -100}
# The tiny model's <|im_end|> (trainer/init_model.py): a large bias ends free text at once, so an
# agent loop that needs a finished (not length-cut) answer gets one.
END_NOW = {"258": 100}
