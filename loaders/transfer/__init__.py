"""Handing batches from DataLoader workers to the trainer cheaply: :mod:`.collate`, :mod:`.chunks`
(several batches per message), :mod:`.transport` (pipe or shared ring), :mod:`.heap` (the worker's
collector)."""
