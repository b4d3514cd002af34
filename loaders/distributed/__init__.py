"""Keeping distributed training honest: :mod:`.world` (rank and worker, read in one place),
:mod:`.sync` (equal step counts, or an error naming the ranks), :mod:`.metrics` (exact global metrics)."""
