"""The test suite in parallel processes, for a GPU machine where one process takes longer than a
session allows (every GPU test JIT-loads the libraries once per process, then shares the GPU):

  python -m bench.parallel_tests [--processes 12] [--timeout SECONDS] [PYTEST_ARGS ...]   (default: tests)

Collects the test ids once and deals them out in turn, so each process gets a share of every
file; ids that contain a --together substring (default: cpu_in_subprocess, whose module fixture
runs every CPU bad-value case at once) all go to the first process. Each process runs under the
timeout (then it is interrupted and reports what it ran). Prints each process's last line and the
totals; exits 1 if a test failed, a process found none of its ids, or a process was cut.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


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


def totals(last_line: str) -> dict[str, int]:
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last_line)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=0, help="seconds per process (0: none)")
    parser.add_argument("--together", action="append", default=None, help="an id substring kept in one process")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = pytest_args or ["tests"]
    together = args.together if args.together is not None else ["cpu_in_subprocess"]
    shares = deal(collect(pytest_args), max(1, args.processes), together)
    workdir = Path(tempfile.mkdtemp(prefix="ddtree_tests_"))
    runs = []
    for k, share in enumerate(shares):
        ids_file = workdir / f"ids{k}.txt"
        ids_file.write_text("\n".join(share) + "\n")
        log = open(workdir / f"log{k}.txt", "w")
        code = (f"import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rfE'] + "
                f"open({str(ids_file)!r}).read().splitlines()))")
        runs.append((subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT), log, len(share)))
    failed = False
    summed: dict[str, int] = {}
    for k, (proc, log, count) in enumerate(runs):
        try:
            proc.wait(timeout=args.timeout or None)
            cut = False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # pytest reports what it ran
            proc.wait()
            cut = True
        log.close()
        lines = (workdir / f"log{k}.txt").read_text().strip().splitlines()
        last = lines[-1] if lines else "(no output)"
        for line in lines:
            if line.startswith(("FAILED", "ERROR")):
                print(line)
        counts = totals(last)
        for kind, n in counts.items():
            summed[kind] = summed.get(kind, 0) + n
        failed |= cut or proc.returncode not in (0, 5) or counts.get("failed", 0) > 0 or not counts
        print(f"process {k} ({count} tests){' CUT BY THE TIMEOUT' if cut else ''}: {last}", flush=True)
    print(f"total: {', '.join(f'{n} {kind}' for kind, n in summed.items())} (logs in {workdir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
