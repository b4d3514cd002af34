"""Decoders of your own, for ``ShardedDataset(decode={field: ...})``.

A :class:`ColumnDecoder` decodes one field of a whole batch at once (``(column, keys, context) -> values``,
the column a :class:`loaders.batches.RaggedBytes`), which keeps ``make_loader``'s batch path;
:func:`column_decoder` makes one from a function of the column. The :class:`DecodeContext` carries the
seed and epoch that random draws must depend on (the same on a resume), and under ``on_error="skip"`` the
list where a decoder notes the samples it could not decode. :class:`DecodeError` is what an undecodable
sample raises. Built-in decoders are named by string; the image crops are :mod:`loaders`' own names.
"""

from loaders.reading.decode import ColumnDecoder, DecodeContext, DecodeError, column_decoder

__all__ = ["ColumnDecoder", "DecodeContext", "DecodeError", "column_decoder"]
