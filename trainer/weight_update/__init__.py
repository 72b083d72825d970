"""How a policy version's weights reach a backend: one interface (`base.py`) and its methods."""

from .base import Staged, WeightUpdate
from .files import FILE_KINDS, DeltaFile, FileUpdate, FullFile, file_update
from .lora import LoraAdapter
from .stored import STORED_KINDS, stored_update

__all__ = [
    "FILE_KINDS",
    "DeltaFile",
    "FileUpdate",
    "FullFile",
    "LoraAdapter",
    "STORED_KINDS",
    "Staged",
    "WeightUpdate",
    "file_update",
    "stored_update",
]
