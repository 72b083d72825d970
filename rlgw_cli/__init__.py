"""The composition root: the `rlgw` command and the commands that assemble processes.

This package is the only code that imports both `gateway` and `trainer` (checked by the
import-linter contracts in pyproject.toml). Handlers import what they run inside the function:
that is for start-up time (torch, transformers and the web stack take seconds to import), not to
hide the dependency from the contracts, which see those imports too.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
