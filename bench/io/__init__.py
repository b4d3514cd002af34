"""bench-io: ``python -m bench.io`` (``make bench-io``), how long training waits for its input, per format.

One package, one measurement: profiles of data (``data``: the byte profiles; ``image_data``: photos),
contenders that read them (``contenders``, ``image_contenders``, ``remote_contenders``; ``lmdb_loop`` and
``decode_limit`` are baselines of their own), the run and its rounds (``run``, with the consumer step of
``compute``), the targets (``targets``) and the report (``report``, ``byte_report``, ``image_report``).
``byte_profiles`` and ``image_profiles`` put these together per kind of run; ``__main__`` parses the flags
and has ``bench.common.report`` write the files and the docs section. ``remote`` is the loopback S3 server
of ``--remote``.
"""
