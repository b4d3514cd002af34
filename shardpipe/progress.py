"""Progress on long work: a tqdm bar on a terminal, plain periodic lines in logs, and a line for each
phase before it (:func:`phase`), so that no long step runs silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Progress:
    """Counts samples and bytes; shows rate and ETA. ``close()`` prints a final summary line."""

    def __init__(
        self,
        description: str,
        total_samples: int,
        *,
        unit: str = "samples",
        stream: TextIO | None = None,
        log_every_s: float = 10.0,
        quiet: bool = False,
    ) -> None:
        self.description = description
        self.total_samples = total_samples
        self.unit = unit
        self.samples = 0
        self.num_bytes = 0
        self.note = ""
        self.stream = stream or sys.stderr
        self.log_every_s = log_every_s
        self.quiet = quiet
        self.started = time.perf_counter()
        self._last_log = self.started
        self._bar: Any = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_samples,
                desc=description,
                unit=unit.rstrip("s"),
                unit_scale=True,
                file=self.stream,
            )

    def update(self, samples: int, num_bytes: int, *, note: str | None = None) -> None:
        """Count ``samples`` more (and their bytes); ``note`` (e.g. "412 out") is shown beside the count."""
        self.samples += samples
        self.num_bytes += num_bytes
        if note is not None:
            self.note = note
        if self._bar is not None:
            self._bar.update(samples)
            postfix = f"{self.num_bytes / 1e6:,.1f} MB" + (f", {self.note}" if self.note else "")
            self._bar.set_postfix_str(postfix, refresh=False)
        elif (
            not self.quiet
            and self.samples < self.total_samples  # the total is close()'s line: said once
            and time.perf_counter() - self._last_log >= self.log_every_s
        ):
            self._last_log = time.perf_counter()
            self._log_line()

    def advance_to(self, samples: int, num_bytes: int) -> None:
        """Count up to ``samples`` and ``num_bytes`` in all (a running total kept elsewhere); never back."""
        more_samples, more_bytes = max(samples - self.samples, 0), max(num_bytes - self.num_bytes, 0)
        if more_samples or more_bytes:
            self.update(more_samples, more_bytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if not self.quiet:
            self._log_line()

    def _log_line(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = self.samples / elapsed
        left = self.total_samples - self.samples
        eta = f", ETA {left / rate:,.0f} s" if rate > 0 and left > 0 else ""
        print(
            f"{self.description}: {self.samples:,}/{self.total_samples:,} {self.unit}"
            f"{f' ({self.note})' if self.note else ''}, "
            f"{self.num_bytes / 1e6:,.1f} MB, {rate:,.0f} {self.unit}/s, "
            f"{self.num_bytes / 1e6 / elapsed:,.1f} MB/s{eta}, {elapsed:,.1f} s",
            file=self.stream,
            flush=True,
        )


@contextmanager
def phase(name: str, what: str, *, quiet: bool = False, stream: TextIO | None = None) -> Iterator[None]:
    """Say ``name: what...`` before a step whose length shows no count (a scan, training dictionaries), and
    how long it took after it."""
    out = stream or sys.stderr
    if not quiet:
        print(f"{name}: {what}...", file=out, flush=True)
    started = time.perf_counter()
    yield
    if not quiet:
        print(f"{name}: done in {time.perf_counter() - started:,.1f} s", file=out, flush=True)
