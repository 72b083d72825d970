"""The code that runs inside a vLLM server: the worker extension that stages, applies, rolls back
and checksums weights (extension.py and its parts), the downloads of version files and adapters
(fetch.py), and the plugin that keeps the CPU build's linear weights (plugin.py).

It imports neither the trainer nor the gateway (an import-linter contract checks it): a backend
needs vLLM, torch and the ground floor (rlgw/weight_files.py, the contract both sides check), no
more. Its settings are its own (settings.py).
"""
