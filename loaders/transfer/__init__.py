"""Handing batches from DataLoader workers to the trainer cheaply: :mod:`.sizing` (how much a worker sends
at once and keeps ready, decided once), :mod:`.collate`, :mod:`.chunks` (several batches per message),
:mod:`.transport` (pipe or shared ring), :mod:`.heap` (the worker's collector)."""
