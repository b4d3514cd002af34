"""What every benchmark shares: the machine's facts (:mod:`~bench.common.system`), the sections of the docs
page (:mod:`~bench.common.docs_page`), the writing of a run's report (:mod:`~bench.common.report`) and the
table shapes the reports print (:mod:`~bench.common.tables`).

Nothing here knows a benchmark: each benchmark package (``bench.pack``, ``bench.shuffle``, ...) measures, and
hands its figures to these modules to record.
"""
