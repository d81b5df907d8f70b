"""Start-up cost of the ``dpsql`` console command, in CPU seconds (issue 22).

Each command is the installed console script (``dpsql`` beside this interpreter, i.e. the
venv's ``bin/dpsql``) run in a subprocess with its output discarded; its cost is the CPU
seconds (user + system) of the finished children, read from :func:`os.times` before and
after, so the figure does not depend on how busy the shared machine's other cores are. Each
command runs ``--repeat`` times; the table shows the best run and the range. Which heavy
libraries each command imported is printed too (``python -X importtime`` of the same
command, top-level names only): ``--help``, ``--version``, a subcommand's ``--help`` and
a usage error should import none of numpy, scipy, duckdb, sqlglot, prompt_toolkit, pandas.
The first row is the bare interpreter (``python -c pass``, with the venv's ``.pth`` files),
for scale. Figures: ``benchmarks/results/startup.txt``.

Run: ``python benchmarks/startup.py [--repeat 3] [--dpsql PATH]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

COMMANDS = (
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["shell", "--help"],
    ["serve", "--help"],
    ["run"],                     # a usage error: the arguments are missing (status 64)
)
HEAVY = ("numpy", "scipy", "duckdb", "sqlglot", "prompt_toolkit", "pandas")


def cpu_seconds(argv: list[str]) -> float:
    """CPU seconds (user + system) the finished child ``argv`` spent."""
    before = os.times()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = os.times()
    return (after.children_user - before.children_user
            + after.children_system - before.children_system)


def heavy_imports(argv: list[str]) -> list[str]:
    """The heavy top-level packages ``argv`` imported (``-X importtime`` of its script)."""
    script, rest = argv[0], argv[1:]
    done = subprocess.run([sys.executable, "-X", "importtime", script, *rest],
                          capture_output=True, text=True, check=False)
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip().split(".")[0]
            if name in HEAVY:
                names.add(name)
    return sorted(names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dpsql", default=os.path.join(os.path.dirname(sys.executable), "dpsql"),
                    help="the console script (default: the one beside this interpreter)")
    args = ap.parse_args()
    if not os.path.exists(args.dpsql):
        ap.error(f"no console script at {args.dpsql}; pip install -e . first")
    print(f"console script: {args.dpsql}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'command':<24} {'best s':>7} {'range s':>13}  heavy imports")
    bare = [cpu_seconds([sys.executable, "-c", "pass"]) for _ in range(args.repeat)]
    print(f"{'(python -c pass)':<24} {min(bare):7.3f} {min(bare):6.3f}-{max(bare):.3f}  "
          "the interpreter's own start, for scale")
    for command in COMMANDS:
        argv = [args.dpsql, *command]
        runs = [cpu_seconds(argv) for _ in range(args.repeat)]
        heavy = heavy_imports(argv)
        print(f"{'dpsql ' + ' '.join(command):<24} {min(runs):7.3f} "
              f"{min(runs):6.3f}-{max(runs):.3f}  {', '.join(heavy) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
