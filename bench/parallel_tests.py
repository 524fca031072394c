"""The test suite in parallel processes, for a GPU machine where one process takes longer than a
session allows (every GPU test JIT-loads the libraries once per process, then shares the GPU):

  python -m bench.parallel_tests [--processes 12] [--timeout SECONDS] [PATHS, -k/-m ...]   (default: tests)

Collects the test ids once (PATHS and selections apply there) and deals them out in turn, so each
process gets a share of every file; ids that contain a --together substring (default:
cpu_in_subprocess, whose module fixture runs every CPU bad-value case at once) all go to the
first process. At the timeout (counted from the start) every process still running is
interrupted at once (each reports what it ran) and killed with its children if it has not
stopped 30 s later, so a caller's own limit must allow --timeout + 30 s. Prints each process's
summary as it ends (logs in --log-dir), then the totals; exits 1 if a test failed or errored, a process reported
nothing, or a process was cut.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUMMARY = re.compile(r"(\d+ (passed|failed|skipped|errors?|deselected)|no tests ran)\b.* in [\d.]+s")


def deal(ids: list[str], processes: int, together: list[str]) -> list[list[str]]:
    """The ids in `processes` shares: those containing a `together` substring in the first, the
    others in turn over the rest (over all of them when there are no such ids)."""
    grouped = [i for i in ids if any(t in i for t in together)]
    rest = [i for i in ids if not any(t in i for t in together)]
    shares: list[list[str]] = [[] for _ in range(processes)]
    shares[0].extend(grouped)
    first = 1 if grouped and processes > 1 else 0
    for k, test_id in enumerate(rest):
        shares[first + k % (processes - first)].append(test_id)
    return [s for s in shares if s]


def collect(pytest_args: list[str]) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", *pytest_args],
                            capture_output=True, text=True)
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    if result.returncode != 0 or not ids:
        sys.exit(f"collection failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return ids


def totals(summary: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary):
        kind = "errors" if kind.startswith("error") else kind
        counts[kind] = counts.get(kind, 0) + int(n)
    return counts


def summary_line(lines: list[str]) -> str:
    """pytest's last summary line (what follows it, e.g. messages at exit, is skipped)."""
    return next((line for line in reversed(lines) if SUMMARY.search(line)), "(no summary)")


def stop_all(procs: list[subprocess.Popen], grace: float = 30.0) -> None:
    """SIGINT to every process group at once (pytest then reports what it ran), one shared grace
    period, then SIGKILL to the groups that are still there."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGINT)
    end = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=0, help="seconds per process (0: none)")
    parser.add_argument("--together", action="append", default=None, help="an id substring kept in one process")
    parser.add_argument("--log-dir", default=None, help="where each process's ids and log go (default: a new temporary folder)")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = pytest_args or ["tests"]
    together = args.together if args.together is not None else ["cpu_in_subprocess"]
    shares = deal(collect(pytest_args), max(1, args.processes), together)
    workdir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="ddtree_tests_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"{len(shares)} processes, logs in {workdir}", flush=True)
    # The CPU references' thread pools share the machine's cores (one full pool per process
    # oversubscribes them: every process slows down), unless the caller set the count.
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // len(shares))))
    runs = []
    for k, share in enumerate(shares):
        ids_file = workdir / f"ids{k}.txt"
        ids_file.write_text("\n".join(share) + "\n")
        log = open(workdir / f"log{k}.txt", "w")
        code = (f"import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rfE'] + "
                f"open({str(ids_file)!r}).read().splitlines()))")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        runs.append((proc, log, len(share)))
    deadline = time.monotonic() + args.timeout if args.timeout else None
    failed = False
    summed: dict[str, int] = {}

    def report(k: int, cut: bool) -> None:  # as each process ends, so a run stopped from outside keeps what ended
        nonlocal failed
        proc, log, count = runs[k]
        log.close()
        lines = (workdir / f"log{k}.txt").read_text().strip().splitlines()
        for line in lines:
            if line.startswith(("FAILED", "ERROR")):
                print(line)
        summary = summary_line(lines)
        counts = totals(summary)
        for kind, n in counts.items():
            summed[kind] = summed.get(kind, 0) + n
        failed |= cut or proc.returncode != 0 or not counts  # pytest exits non-zero on a failure or an error
        print(f"process {k} ({count} tests){' CUT BY THE TIMEOUT' if cut else ''}: {summary}", flush=True)

    running = set(range(len(runs)))
    while running and (deadline is None or time.monotonic() < deadline):
        for k in sorted(running):
            if runs[k][0].poll() is not None:
                running.discard(k)
                report(k, cut=False)
        time.sleep(0.5)
    if running:
        stop_all([runs[k][0] for k in sorted(running)])
        for k in sorted(running):
            report(k, cut=True)
    print(f"total: {', '.join(f'{n} {kind}' for kind, n in summed.items())} (logs in {workdir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
