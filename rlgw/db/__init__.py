"""Database layer shared by gateway, trainer and CLI: tables, engines, compact token arrays."""
