"""``python -m bench.scaling``: weak scaling of DDP training over 1..N ranks, one torchrun launch per count.

Weak scaling: the per-rank batch size, model and threads per rank stay fixed while ranks are added, so
ideal global samples/s grows N-fold; efficiency = SPS_N / (N x SPS_1). Gloo on CPU, NCCL with one rank per
GPU when CUDA devices are present. Data: 1 KiB samples packed into tar shards by ``python -m shardpipe
pack`` (cached by fingerprint), or ``--synthetic`` in-memory batches to take I/O out of the picture.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common.report import Chart, DocsSection, Run, write_report
from bench.io import data
from bench.scaling import report
from bench.scaling.model import analytic_flops_per_sample, build_mlp, counted_flops_per_sample

SAMPLE_BYTES = 1024


class LaunchError(RuntimeError):
    """A torchrun launch failed; the message holds what its ranks printed."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    p.add_argument(
        "--max-ranks", type=int, default=gpus or 2, help="largest rank count (default: GPUs, or 2)"
    )
    p.add_argument("--quick", action="store_true", help="short windows, 3 repeats, small data (< 40 s)")
    p.add_argument("--synthetic", action="store_true", help="in-memory batches: no loader, no I/O")
    p.add_argument("--batch-size", type=int, default=64, help="per rank (fixed: weak scaling)")
    p.add_argument("--hidden", type=int, default=1024, help="MLP width")
    p.add_argument("--layers", type=int, default=2, help="hidden layers of the MLP")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (OMP_NUM_THREADS too)")
    p.add_argument("--warmup", type=int, help="discarded steps per launch (default 10, --quick 3)")
    p.add_argument("--steps", type=int, help="steps per measurement window (default 60, --quick 15)")
    p.add_argument("--repeats", type=int, help="windows per launch (default 5, --quick 3)")
    p.add_argument("--threshold", type=float, default=0.85, help="efficiency below which the report explains")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "scaling")
    p.add_argument("--cache", type=Path, default=Path("bench-results") / "scaling-cache")
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch before it is killed")
    p.add_argument(
        "--docs",
        type=Path,
        help="also write this run's section of this Markdown page (make bench-scaling: docs/benchmarks.md)",
    )
    args = p.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    args.steps = args.steps or (15 if args.quick else 60)
    args.repeats = args.repeats or (3 if args.quick else 5)
    for flag in ("max_ranks", "batch_size", "hidden", "layers", "threads", "steps", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.workers < 0 or args.warmup < 0:
        p.error("--workers and --warmup must be >= 0")
    if gpus and args.max_ranks > gpus:
        p.error(f"--max-ranks {args.max_ranks} > {gpus} CUDA devices (one rank per GPU)")
    return args


def num_samples(args: argparse.Namespace) -> int:
    """Enough samples that the largest launch's ranks each fit warm-up + all windows in one epoch."""
    per_rank: int = args.batch_size * (args.warmup + args.steps * args.repeats + args.workers + 1)
    return math.ceil(int(args.max_ranks) * per_rank / 4000) * 4000


def prepare_tar(samples: int, cache: Path) -> tuple[Path, dict[str, Any]]:
    """1 KiB (+-25%) random samples in ten classes, packed to tar once per fingerprint (tree then removed)."""
    profile = data.Profile("scaling", samples, SAMPLE_BYTES)
    root = cache / f"scaling-{samples}-{profile.fingerprint}"
    ready, packed, packer = root / "ready.json", root / "tar", data.packer_fingerprint()
    if not (ready.exists() and json.loads(ready.read_text()).get("packer") == packer):
        shutil.rmtree(root, ignore_errors=True)
        print(f"building {samples:,} samples of ~{SAMPLE_BYTES} B and packing them (tar) into {root}")
        total = data._write_tree(profile, root / "files")  # the io benchmark's generator
        command = [
            sys.executable, "-m", "shardpipe", "pack", str(root / "files"), str(packed), "--format", "tar",
            "--labels", "dirname", "--max-samples", str(math.ceil(samples / data.NUM_SHARDS)),
            "--max-bytes", "none", "--workers", "2", "--quiet",
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(root / "files")
        ready.write_text(json.dumps({"payload_bytes": total, "packer": packer}))
    info = {"path": str(packed), "num_samples": samples, "fingerprint": profile.fingerprint}
    info["mean_sample_bytes"] = json.loads(ready.read_text())["payload_bytes"] / samples
    return packed, info


def launch(ranks: int, cfg: dict[str, Any], tmp: Path, timeout: float) -> dict[str, Any]:
    """One torchrun with ``ranks`` processes; returns what rank 0 gathered."""
    cfg = {**cfg, "result": str(tmp / f"result-{ranks}.json")}
    config = tmp / f"config-{ranks}.json"
    config.write_text(json.dumps(cfg))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
        "-m", "bench.scaling.worker", "--config", str(config),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg["threads"])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        ranks_said = [line for line in done.stderr.splitlines() if line.startswith("[rank")]
        said = "\n".join(ranks_said[-60:]) or done.stderr[-4000:]
        raise LaunchError(f"the {ranks}-rank launch exited {done.returncode}:\n{done.stdout[-2000:]}{said}")
    result: dict[str, Any] = json.loads(Path(cfg["result"]).read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    dataset: dict[str, Any] | None = None
    path = None
    if not args.synthetic:
        path, dataset = prepare_tar(num_samples(args), args.cache)
    mlp = build_mlp(args.hidden, args.layers)
    model = {
        "kind": "MLP", "input_bytes": mlp[0].in_features, "hidden": args.hidden, "layers": args.layers,
        "parameters": sum(p.numel() for p in mlp.parameters()),
        "flops_per_sample": counted_flops_per_sample(mlp, args.batch_size),
        "flops_per_sample_analytic": analytic_flops_per_sample(mlp),
    }  # fmt: skip
    cfg = {
        **{
            k: getattr(args, k) for k in ("synthetic", "batch_size", "hidden", "layers", "workers", "threads")
        },
        **{k: getattr(args, k) for k in ("warmup", "steps", "repeats")},
        "data": str(path) if path else None,
        "cuda": cuda,
    }
    launches: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        for ranks in range(1, args.max_ranks + 1):
            try:
                launches[ranks] = launch(ranks, cfg, Path(tmp), args.timeout)
            except LaunchError as exc:
                print(exc, file=sys.stderr)
                return 1
            print(f"  {ranks} rank(s): {report.quick_line(launches[ranks], args.batch_size)}", flush=True)
    results = report.summarize(launches, model["flops_per_sample"], args.threshold)
    run = Run.of("bench.scaling", argv, args)
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.perf_counter() - started, 1),
        "hardware": run.machine,
        "versions": run.versions,
        "backend": launches[1]["backend"],
        "device": "cuda" if cuda else "cpu",
        "parameters": run.parameters,
        "model": model,
        "data": dataset or {"synthetic": True, "note": "8 random in-memory batches per rank, cycled"},
        "rules": report.RULES,
        "notes": report.notes(cuda, run.machine),
    }
    docs = None
    if args.docs:
        lines = report.result_lines(meta, results, "####")
        settings = {k: meta[k] for k in ("backend", "device", "model", "data")}
        docs = DocsSection(args.docs, "bench-scaling", "weak scaling", report.RULES, lines, settings)
    record = {**meta, "results": results}
    figure = Chart(
        "scaling.png", lambda path: report.chart(path, results), "weak scaling and the step's parts"
    )
    paths = write_report(args.out, run, record, report.markdown(meta, results), charts=[figure], docs=docs)
    print(report.table(results))
    for entry in results:
        if entry["explanation"]:
            print(f"{entry['ranks']} ranks: {entry['explanation']}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
