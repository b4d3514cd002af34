"""The ``shardpipe`` command: :mod:`.commands` (the group, verify, inspect, index) and :mod:`.pack` parse
and call the library; :mod:`.exit_codes` turns its errors into exit codes; :mod:`.storage` reads the
storage flags and shows locations without credentials; :mod:`.get` gives one sample, by position or key,
listed or written out as files."""

from shardpipe.process_settings import single_threaded_blas

single_threaded_blas()  # this package is the command's entry point: it runs before anything loads numpy

from shardpipe.cli.commands import main  # noqa: E402

__all__ = ["main"]
