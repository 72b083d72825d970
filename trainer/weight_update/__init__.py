"""How a policy version's weights reach a backend: one interface (`base.py`) and its methods."""

from .base import Staged, WeightUpdate
from .files import FILE_KINDS, DeltaFile, FileUpdate, FullFile, stored_update
from .lora import LoraAdapter
from .stored import STORED_KINDS

__all__ = [
    "FILE_KINDS",
    "DeltaFile",
    "FileUpdate",
    "FullFile",
    "LoraAdapter",
    "STORED_KINDS",
    "Staged",
    "WeightUpdate",
    "stored_update",
]
