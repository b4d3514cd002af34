"""Planning an epoch, a pure function of (counts, world, seed, epoch): :mod:`.planner` (which samples
each rank and worker reads), :mod:`.elastic` (resuming on another world), :mod:`.mixing` (defaults by
pack order), :mod:`.position` (where a run stands, shared with workers)."""
