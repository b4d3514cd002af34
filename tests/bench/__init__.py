"""The benchmarks' and the demo's tests (``bench`` marker): they run the scripts, slowly, end to end."""
