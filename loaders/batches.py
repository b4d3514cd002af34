"""What a batch from ``make_loader`` is made of.

A :class:`Batch` is a dict (``__key__``, ``__pad__``, one entry per field) that crosses from a DataLoader
worker cheaply; each raw byte field is one :class:`RaggedBytes` (one buffer plus offsets).
:func:`collate_samples` is the collate function of the per-sample path (a ``transform``, or a decoder
that takes one sample). :class:`RingStalledError` is raised in a worker that cannot hand its batch over
(the trainer is gone, or never frees a slot of the shared ring).
"""

from loaders.transfer.collate import Batch, RaggedBytes, collate_samples
from loaders.transfer.transport import RingStalledError

__all__ = ["Batch", "RaggedBytes", "RingStalledError", "collate_samples"]
