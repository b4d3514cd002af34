"""Sample sources: a directory tree, a file list (CSV, JSON Lines, Parquet) or a Parquet dataset (rows as
samples, Hugging Face's layout), a path or a URL.

A sample is a key plus named fields. :func:`scan_source` reads a source's metadata into a
:class:`SampleTable`; the pack workers read the bytes.

Inside: :mod:`.scan` (which kind a source is, scanned and checked) and :mod:`.table` (the scanned samples as a
table); :mod:`.tree` (a directory tree); :mod:`.file_list` (file lists), :mod:`.list_piece` (one piece of a
list, read by one task), :mod:`.line_pieces` (a text file cut into byte ranges of whole lines) and
:mod:`.ordered` (one task per piece, results in piece order); :mod:`.parquet_table` (a Parquet dataset),
:mod:`.parquet_layout` (which files form it, and their splits), :mod:`.parquet_columns` (which columns become
fields), :mod:`.parquet_cells` (cells as field bytes), :mod:`.parquet_pieces` (the read of one piece),
:mod:`.arrow_files` (``save_to_disk``'s Arrow files, read as Parquet files are) and :mod:`.hf_features` (a
Hugging Face dataset's features); :mod:`.keys` (what a sample's key may be) and :mod:`.urls` (cells that are
URLs: their stores, sizes and bytes).
"""

from shardpipe.sources.scan import IncompleteSamplesError, scan_source
from shardpipe.sources.table import Grouped, SampleTable, Scan

__all__ = ["Grouped", "IncompleteSamplesError", "SampleTable", "Scan", "scan_source"]
