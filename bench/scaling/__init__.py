"""Weak-scaling benchmark: ``python -m bench.scaling`` (``make bench-scaling``).

``__main__`` builds the data and launches one torchrun per rank count; ``worker`` is what each rank runs;
``model`` holds the MLP, its FLOP count and the timed all-reduce hook; ``report`` turns the ranks' step
timings into samples/s, efficiency, TFLOPS and a breakdown, and writes ``report.json`` / ``report.md``.
"""
