"""Sample sources: a directory tree, a file list (CSV, JSON Lines, Parquet) or a Parquet dataset (rows as
samples, Hugging Face's layout), a path or a URL.

A sample is a key plus named fields. :func:`scan_source` reads a source's metadata into a
:class:`SampleTable`; the pack workers read the bytes.
"""

from shardpipe.sources.scan import IncompleteSamplesError, scan_source
from shardpipe.sources.table import Grouped, SampleTable, Scan

__all__ = ["Grouped", "IncompleteSamplesError", "SampleTable", "Scan", "scan_source"]
