"""Two commits' benchmark figures side by side: same run, same machine, interleaved.

For an acceptance point such as "bench/ figures are not worse than those recorded before the
change", this runs the benchmarks of this directory for two versions of kuikproxy and prints
one table: each figure's median over the rounds and its spread (min–max) for each side, the
ratio B/A and a verdict.

How (nothing in the main work tree is touched: no checkout, no stash, no file written there):

* each side gets its own ``git worktree add --detach /tmp/kuik-compare-XXXX/{a,b} <ref>``; the
  side ``worktree`` (B's default) is HEAD's worktree with the main work tree's uncommitted and
  untracked (not ignored) files copied over it once, at the start, so that edits made while the
  comparison runs do not leak into it. Both worktrees are removed at the end (``git worktree
  remove --force``, ``git worktree prune``); the logs of every run are kept under the same
  ``/tmp/kuik-compare-XXXX`` directory.
* every run uses one interpreter (``--python``, by default the one running this file: use
  ``.venv/bin/python``), started in its side's tree with ``PYTHONPATH=<that tree>``, so each side
  imports its *own* ``kuikproxy`` (checked before the first run: ``kuikproxy.__file__`` must lie
  in the tree; ``PYTHONPATH`` comes before the venv's editable install of /work/main) and its own
  test helpers (``tests/e2e/peers.py``, ``tests/upstream_app.py``; a note says when they differ);
* the bench scripts are the harness: both sides run the *newer* side's copy (``--harness``),
  written into the older side's worktree. The scripts import kuikproxy internals by module path
  (``kuikproxy.core.scheduler``, ``kuikproxy.runtime.pacer._Host``, …); when the newer copy does
  not import against the older tree (checked before the first run), or fails while running,
  that side runs its *own* copy instead, and the output says so;
* rounds are interleaved per benchmark: A, B, A, B, … (``--rounds``, 3 by default), so that the
  machine's noise falls on both sides alike;
* figures are read from each script's printed tables (no script needs a flag for it, so the
  scripts of an older commit can be read too).

Verdicts (kuikproxy's figures; the peers' — nginx, the registry, bare and stock aiohttp — are
``(reference)``: they tell how noisy the machine was): ``better`` or ``WORSE`` when the two
sides' ranges (min–max over the rounds) do not overlap and the medians differ by more than
``--tolerance`` (3 % by default) and by more than one unit of the last digit the script printed
(0.1 µs, say); otherwise ``same``. Ratios such as ``blob kuikproxy ÷ nginx``
and ``HEAD kuikproxy steady ÷ bare aiohttp`` come from one run each and cancel most of the
machine's drift. Exit status: 0, 1 when a figure is WORSE, 2 when a run failed.

Everything the benchmarks contact is on 127.0.0.1 (see each script); this file only runs git
and the scripts.

Run::

    .venv/bin/python bench/compare.py                           # HEAD~1 vs the work tree
    .venv/bin/python bench/compare.py HEAD~1 HEAD --only scheduler,state
    .venv/bin/python bench/compare.py --quick --rounds 1        # a smoke test, ~2 minutes
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import difflib
import filecmp
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKTREE = "worktree"  # the side made of the main work tree, uncommitted changes included
HELPERS = ("tests/e2e/peers.py", "tests/upstream_app.py", "pyproject.toml")


# --- figures and what the scripts print -------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    higher_is_better: bool
    reference: bool = False  # a peer's figure (nginx, the registry, aiohttp): machine noise
    step: float = 0.0  # the last printed digit's unit: medians this close are the same


def number(text: str) -> float:
    return float(text.replace(",", "").replace("+", "").rstrip("%"))


def printed(name: str, text: str, higher_is_better: bool, reference: bool = False) -> Figure:
    """A figure as a script printed it: ``step`` is the unit of its last digit."""
    decimals = len(text.rstrip("%").partition(".")[2])
    return Figure(name, number(text), higher_is_better, reference, 10.0**-decimals)


def parse_scheduler(out: str) -> list[Figure]:
    """``bench/scheduler.py``'s two tables: build rows and mode rows, by shape label."""
    figures: list[Figure] = []
    builds: list[Figure] = []
    for line in out.splitlines():
        m = re.match(r"^(\d[\d,]* × [\d,]+)\s+(.*)$", line)
        if not m:
            continue
        label, tokens = m[1], m[2].split()
        if len(tokens) == 10 and tokens[0] in ("prefetch", "hold"):
            mode = tokens[0]
            _, _, _, _, per_s, median, p99, _, done, _ = tokens
            figures += [
                printed(f"{label} {mode} median µs", median, False),
                printed(f"{label} {mode} p99 µs", p99, False),
                printed(f"{label} {mode} decisions/s", per_s, True),
                printed(f"{label} {mode} read_done µs", done, False),
            ]
        elif len(tokens) == 7:
            _, build_s, _, per_entry, gc_ms, _, _ = tokens
            builds += [
                printed(f"{label} build s", build_s, False),
                printed(f"{label} B/entry", per_entry, False),
                printed(f"{label} full GC ms", gc_ms, False),
            ]
    return figures + builds


def parse_held(out: str) -> list[Figure]:
    figures: list[Figure] = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(
            r"^(kuikproxy|stock aiohttp)\s+[\d,]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)", line
        ):
            reference = m[1] != "kuikproxy"
            figures += [
                printed(f"{m[1]} KB per held request", m[3], False, reference),
                printed(f"{m[1]} connect s", m[2], False, reference),
            ]
        elif m := re.match(r"^kuikproxy over stock aiohttp: ([+-]?[\d.]+) KB", line):
            figures.append(printed("kuikproxy − stock aiohttp KB per held", m[1], False))
        elif line.startswith("lateness ms") and i + 1 < len(lines):
            p50, p99, *_ = lines[i + 1].split()
            figures += [
                printed("window lateness p50 ms", p50, False),
                printed("window lateness p99 ms", p99, False),
            ]
        elif m := re.search(r"let go of all [\d,]+ held requests ([\d.]+) s", line):
            figures.append(printed("let go of all held, s", m[1], False))
    return figures


HEAD_ROW = re.compile(
    r"^(direct|nginx|bare aiohttp|kuikproxy steady|kuikproxy)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)"
    r"\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\d+%\s+([\d.]+)→([\d.]+)\s+(.*)$"
)


def parse_proxy(out: str) -> list[Figure]:
    figures: list[Figure] = []
    section = ""
    rps: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith(("(a) ", "(b) ")):
            section = line[:3]
        elif section == "(a)" and (m := re.match(r"^(direct|nginx|kuikproxy)\s+(.*)$", line)):
            name, tokens = m[1], m[2].split()
            if len(tokens) < 6:
                continue
            median, _, _, per_nginx, growth = tokens[-5:]
            kuik = name == "kuikproxy"
            figures.append(printed(f"blob {name} MiB/s", median, True, not kuik))
            if kuik:
                figures += [
                    printed("blob kuikproxy ÷ nginx", per_nginx, True),
                    printed("blob kuikproxy RSS growth MiB", growth, False),
                ]
        elif section == "(b)" and (m := HEAD_ROW.match(line)):
            name = m[1]
            kuik = name.startswith("kuikproxy")
            rps[name] = number(m[3])
            figures += [
                printed(f"HEAD {name} req/s", m[3], True, not kuik),
                printed(f"HEAD {name} p50 ms", m[4], False, not kuik),
                printed(f"HEAD {name} p99 ms", m[5], False, not kuik),
            ]
            if kuik:
                statuses = m[9].split()
                ok = sum(int(s[4:]) for s in statuses if s.startswith("200×"))
                requests = int(number(m[2]))
                figures += [
                    printed(f"HEAD {name} RSS after MiB", m[8], False),
                    Figure(f"HEAD {name} answers not 200", requests - ok, False),
                ]
    bare = rps.get("bare aiohttp")
    for name in ("kuikproxy steady", "kuikproxy"):
        if bare and name in rps:
            figures.append(Figure(f"HEAD {name} ÷ bare aiohttp", rps[name] / bare, True))
    return figures


def parse_state(out: str) -> list[Figure]:
    figures: list[Figure] = []
    for line in out.splitlines():
        if m := re.match(r"^(ring image|resource|host): ([\d,]+) bytes", line):
            figures.append(printed(f"{m[1]} bytes", m[2], False))
            if t := re.search(r"window timers left: (\d+)", line):
                figures.append(printed("window timers left", t[1], False))
        elif m := re.match(
            r"^\s+(\S+)\s+loop held at most\s+([\d.]+) ms \(median\s+([\d.]+)\); answered in"
            r"\s+([\d.]+) ms \(max\s+[\d.]+\), ([\d,]+) KiB",
            line,
        ):
            figures += [
                printed(f"{m[1]} loop held max ms", m[2], False),
                printed(f"{m[1]} loop held median ms", m[3], False),
                printed(f"{m[1]} answered in ms", m[4], False),
                printed(f"{m[1]} KiB", m[5], False),
            ]
    return figures


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    parse: Callable[[str], list[Figure]]


BENCHES = (
    Bench("scheduler", "scheduler.py", (), ("--quick",), parse_scheduler),
    Bench(
        "scheduler-shared",
        "scheduler.py",
        ("--images", "shared"),
        ("--quick", "--images", "shared"),
        parse_scheduler,
    ),
    Bench("held", "held.py", (), ("--connections", "2000", "--seconds", "3"), parse_held),
    Bench(
        "proxy",
        "proxy.py",
        (),
        ("--blob-mib", "64", "--rounds", "1", "--seconds", "2", "--steady-images", "512"),
        parse_proxy,
    ),
    Bench(
        "state",
        "state.py",
        (),
        ("--resources", "2000", "--hosts", "200", "--images", "20000", "--rounds", "3"),
        parse_state,
    ),
)
BY_NAME = {b.name: b for b in BENCHES}


# --- the two sides ----------------------------------------------------------------------------


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Side:
    key: str  # "A" or "B"
    ref: str
    commit: str
    tree: Path
    label: str = ""
    changed: int = 0  # files of the work tree copied over HEAD (the worktree side)

    @property
    def short(self) -> str:
        return self.commit[:7]


def resolve(ref: str) -> str:
    return git("rev-parse", "--verify", f"{'HEAD' if ref == WORKTREE else ref}^{{commit}}").strip()


def add_worktree(side: Side) -> None:
    git("worktree", "add", "--detach", str(side.tree), side.commit)
    if side.ref == WORKTREE:
        side.changed = copy_work_tree(side.tree)
        side.label = f"work tree ({side.short}" + (
            f" + {side.changed} files)" if side.changed else ", clean)"
        )
    else:
        side.label = side.ref if side.ref.startswith(side.short) else f"{side.ref} ({side.short})"


def copy_work_tree(dest: Path) -> int:
    """Copy the main work tree's tracked and untracked (not ignored) files that differ from
    HEAD's over ``dest``, and delete there what was deleted here; returns how many."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    changed = 0
    for rel in sorted({p for p in listed if p}):
        src, dst = REPO / rel, dest / rel
        if src.is_symlink() or src.is_file():
            if dst.is_file() and not src.is_symlink() and filecmp.cmp(src, dst, shallow=False):
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_symlink() or dst.exists():
                dst.unlink()
            shutil.copy2(src, dst, follow_symlinks=False)
            changed += 1
        elif not src.exists() and (dst.is_symlink() or dst.is_file()):
            dst.unlink()
            changed += 1
    return changed


def newer(a: Side, b: Side) -> Side:
    if b.ref == WORKTREE:
        return b
    if a.ref == WORKTREE:
        return a
    for old, new in ((a, b), (b, a)):
        done = subprocess.run(
            ["git", "-C", str(REPO), "merge-base", "--is-ancestor", old.commit, new.commit],
            check=False,
        )
        if done.returncode == 0:
            return new
    times = {s.key: int(git("show", "-s", "--format=%ct", s.commit)) for s in (a, b)}
    return b if times["B"] >= times["A"] else a


@dataclass
class Plan:
    """Which copy of a bench script each side runs."""

    script: Path  # the harness copy (the newer side's), or this side's own
    own: Path | None  # this side's own copy when it differs from the harness copy
    note: str = ""


def prepare_scripts(sides: list[Side], harness: Side | None, bench: Bench) -> dict[str, Plan]:
    """Write the harness side's copy of ``bench``'s script into the other side's tree (its own
    copy kept next to it as ``_own_<script>``); no copy at all with ``harness`` None."""
    plans: dict[str, Plan] = {}
    for side in sides:
        target = side.tree / "bench" / bench.script
        source = (harness or side).tree / "bench" / bench.script
        if side is harness or harness is None or not source.exists():
            plans[side.key] = Plan(target, None)
            continue
        own = target.with_name(f"_own_{bench.script}")
        if own.exists():  # written for another benchmark of the same script
            plans[side.key] = Plan(target, own)
            continue
        if target.exists():
            if filecmp.cmp(source, target, shallow=False):
                plans[side.key] = Plan(target, None)
                continue
            target.replace(own)
        shutil.copy2(source, target)
        plans[side.key] = Plan(target, own if own.exists() else None)
    return plans


def differences(own: Path, other: Path) -> str:
    """How a side's own copy of a bench script differs from the other side's."""
    texts = [own.read_text(), other.read_text()]
    with contextlib.suppress(SyntaxError):
        trees = [ast.parse(t) for t in texts]
        for tree in trees:
            for node in ast.walk(tree):
                if hasattr(node, "body") and isinstance(node.body, list):
                    node.body = [
                        n for n in node.body if not isinstance(n, ast.Import | ast.ImportFrom)
                    ]
        if ast.dump(trees[0]) == ast.dump(trees[1]):
            return "differs from it only in its imports"
    diff = difflib.unified_diff(texts[0].splitlines(), texts[1].splitlines(), lineterm="", n=0)
    changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
    return f"differs from it in {changed} lines, not only imports"


def run_env(side: Side) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(side.tree)
    return env


IMPORT_CHECK = """
import runpy, sys
runpy.run_path(sys.argv[1], run_name="bench_import_check")
import kuikproxy
print(kuikproxy.__file__)
"""


def import_check(python: str, side: Side, script: Path) -> str | None:
    """None when ``script`` imports against ``side``'s tree and kuikproxy comes from that tree;
    otherwise what went wrong."""
    done = subprocess.run(
        [python, "-c", IMPORT_CHECK, str(script)],
        cwd=side.tree,
        env=run_env(side),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    where = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if not Path(where).resolve().is_relative_to(side.tree.resolve()):
        return f"kuikproxy imported from {where}, not from {side.tree}"
    return None


# --- running ----------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


@dataclass
class Run:
    bench: str
    side: str
    round: int
    script: str
    seconds: float
    status: int
    loadavg: str
    figures: list[Figure]
    log: str


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def run_script(
    python: str, side: Side, script: Path, args: list[str], log: Path, *, timeout: float
) -> tuple[int, str, float]:
    """Run one bench script in ``side``'s tree; (exit status, stdout, seconds). Its process
    group is stopped (SIGINT, then SIGKILL) on a timeout or when this run is interrupted."""
    started = time.monotonic()
    with log.open("w") as err:
        process = subprocess.Popen(
            [python, str(script), *args],
            cwd=side.tree,
            env=run_env(side),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(process)
            err.write(f"\n[compare.py: stopped after {timeout:g} s]\n")
            return -1, "", time.monotonic() - started
        except BaseException:
            stop_group(process)
            raise
    return process.returncode, out, time.monotonic() - started


def stop_group(process: subprocess.Popen[str]) -> None:
    """Stop the process this file started, and its group (the bench's own peers follow it:
    they are started with a parent-death signal)."""
    for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=wait)
            return


@dataclass
class Comparison:
    args: argparse.Namespace
    a: Side
    b: Side
    harness: Side | None  # None: each side runs its own scripts
    root: Path
    notes: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    failed: bool = False

    def say(self, text: str) -> None:
        print(text, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.say(f"note: {text}")

    def bench(self, bench: Bench) -> None:
        extra = shlex.split(self.args.extra.get(bench.name, ""))
        args = [*(bench.quick if self.args.quick else bench.full), *extra]
        self.say(f"\n== {bench.name}: bench/{bench.script} {shlex.join(args)}".rstrip())
        sides = [self.a, self.b]
        plans = prepare_scripts(sides, self.harness, bench)
        usable: list[Side] = []
        for side in sides:
            plan = plans[side.key]
            problem = import_check(self.args.python, side, plan.script)
            if problem and plan.own is not None:
                self.note(
                    f"{bench.name}: {side.key} runs its own bench/{bench.script} (which "
                    f"{differences(plan.own, plan.script)}): the other side's copy does not "
                    f"import against {side.label}: {problem}"
                )
                plan.script, plan.own, plan.note = plan.own, None, "own copy"
                problem = import_check(self.args.python, side, plan.script)
            if problem:
                self.note(f"{bench.name}: {side.key} skipped: {problem}")
                self.failed = True
                continue
            usable.append(side)
            self.say(f"   {side.key} runs {plan.script.relative_to(self.root)}")
        if self.args.check or not usable:
            return
        for r in range(1, self.args.rounds + 1):
            for side in usable:
                self.run_once(bench, side, plans[side.key], args, r)

    def run_once(self, bench: Bench, side: Side, plan: Plan, args: list[str], r: int) -> None:
        while True:
            log = self.root / "logs" / f"{bench.name}-r{r}-{side.key}"
            load = loadavg()
            status, out, seconds = run_script(
                self.args.python,
                side,
                plan.script,
                args,
                log.with_suffix(".err"),
                timeout=self.args.timeout,
            )
            log.with_suffix(".out").write_text(out)
            figures = bench.parse(out) if status == 0 else []
            copy = f" ({plan.note})" if plan.note else ""
            self.say(
                f"[{bench.name} round {r}/{self.args.rounds} {side.key} {side.label}{copy}: "
                f"{seconds:.0f} s, {len(figures)} figures, exit {status}, load {load}]"
            )
            if (status != 0 or not figures) and plan.own is not None:
                self.note(
                    f"{bench.name}: the other side's bench/{bench.script} failed on "
                    f"{side.label} (see {log}.err); {side.key} runs its own copy (which "
                    f"{differences(plan.own, plan.script)}) from now on"
                )
                plan.script, plan.own, plan.note = plan.own, None, "own copy"
                continue
            if status != 0 or not figures:
                self.failed = True
                self.note(
                    f"{bench.name}: round {r} of {side.key} "
                    + (
                        "timed out"
                        if status == -1
                        else f"exited {status}"
                        if status
                        else "printed no figures"
                    )
                    + f" (see {log}.err and .out)"
                )
            self.runs.append(
                Run(
                    bench.name,
                    side.key,
                    r,
                    str(plan.script),
                    seconds,
                    status,
                    load,
                    figures,
                    log=str(log),
                )
            )
            return


# --- the table --------------------------------------------------------------------------------


def fmt(value: float, step: float = 0.0) -> str:
    """As the script printed it (``step``: its last digit's unit), else by magnitude."""
    if step:
        decimals = max(0, round(-math.log10(step)))
        return f"{value:,.{decimals}f}"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def summary(values: list[float], step: float) -> str:
    if not values:
        return "—"
    median = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt(median, step)
    return f"{fmt(median, step)} ({fmt(min(values), step)}–{fmt(max(values), step)})"


def verdict(row: Row, tol: float) -> str:
    a, b = row.a, row.b
    if not a or not b:
        return "n/a"
    if row.reference:
        return "(reference)"
    ma, mb = statistics.median(a), statistics.median(b)
    gain = mb - ma if row.higher else ma - mb  # > 0: B is better
    relative = gain / abs(ma) if ma else (0.0 if gain == 0 else float("inf") * gain)
    overlap = min(b) <= max(a) and min(a) <= max(b)
    if overlap or abs(relative) <= tol or abs(gain) <= row.step * 1.001:
        return "same"
    return "better" if gain > 0 else "WORSE"


@dataclass
class Row:
    bench: str
    figure: str
    higher: bool
    reference: bool
    step: float = 0.0
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)


def rows_of(runs: list[Run]) -> list[Row]:
    rows: dict[tuple[str, str], Row] = {}
    for run in runs:
        for f in run.figures:
            row = rows.setdefault(
                (run.bench, f.name), Row(run.bench, f.name, f.higher_is_better, f.reference)
            )
            (row.a if run.side == "A" else row.b).append(f.value)
            row.step = max(row.step, f.step)
    return list(rows.values())


def table(rows: list[Row], a: Side, b: Side, tol: float) -> tuple[list[str], list[str]]:
    head = ["benchmark", "figure", "better", f"A: {a.label}", f"B: {b.label}", "B/A", "verdict"]
    body: list[list[str]] = []
    worse: list[str] = []
    for row in rows:
        ma = statistics.median(row.a) if row.a else None
        mb = statistics.median(row.b) if row.b else None
        ratio = f"{mb / ma:.2f}" if ma and mb is not None else "—"
        v = verdict(row, tol)
        if v == "WORSE":
            worse.append(f"{row.bench}: {row.figure}")
        body.append(
            [
                row.bench,
                row.figure,
                "higher" if row.higher else "lower",
                summary(row.a, row.step),
                summary(row.b, row.step),
                ratio,
                v,
            ]
        )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    right = {3, 4, 5}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [line(head), line(["-" * w for w in widths])]
    previous = ""
    for cells in body:
        if previous and cells[0] != previous:
            lines.append("")
        previous = cells[0]
        lines.append(line(cells))
    return lines, worse


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n", 1)[0],
        epilog=f"benchmarks: {', '.join(BY_NAME)}. See the module docstring for the method.",
    )
    parser.add_argument("a", nargs="?", default="HEAD~1", help="ref A, the before (HEAD~1)")
    parser.add_argument(
        "b",
        nargs="?",
        default=WORKTREE,
        help=f"ref B, the after; '{WORKTREE}' (the default) is the work tree as it is now, "
        "uncommitted changes included (HEAD when it is clean)",
    )
    parser.add_argument("--only", default=",".join(BY_NAME), help="comma-separated benchmarks")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side and benchmark (3)")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke test of the harness"
    )
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="more arguments for one benchmark's script, e.g. 'proxy=--seconds 5'",
    )
    parser.add_argument(
        "--harness",
        choices=("newer", "a", "b", "own"),
        default="newer",
        help="whose bench scripts both sides run (own: each side its own)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.03, help="medians this close are 'same' (0.03)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run (1800)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for every run")
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only make the worktrees and say which script each side would run",
    )
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in BY_NAME]
    if unknown or not only:
        parser.error(f"--only: unknown {unknown}; choose among {', '.join(BY_NAME)}")
    args.benches = [BY_NAME[n] for n in only]
    args.extra = {}
    for item in args.args:
        name, _, rest = item.partition("=")
        if name not in BY_NAME:
            parser.error(f"--args {item!r}: no benchmark {name!r}")
        args.extra[name] = f"{args.extra.get(name, '')} {rest}".strip()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.a == WORKTREE == args.b:
        parser.error(f"only one side can be '{WORKTREE}'")
    for ref in (args.a, args.b):
        try:
            resolve(ref)
        except RuntimeError as error:
            parser.error(str(error))
    return args


@contextlib.contextmanager
def worktrees(sides: list[Side]) -> Iterator[None]:
    try:
        yield
    finally:
        for side in sides:
            if side.tree.exists():
                with contextlib.suppress(RuntimeError):
                    git("worktree", "remove", "--force", str(side.tree))
        with contextlib.suppress(RuntimeError):
            git("worktree", "prune")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    root = Path(tempfile.mkdtemp(prefix="kuik-compare-", dir="/tmp"))
    (root / "logs").mkdir()
    a = Side("A", args.a, resolve(args.a), root / "a")
    b = Side("B", args.b, resolve(args.b), root / "b")
    started = time.monotonic()
    print(
        f"{dt.datetime.now(dt.UTC):%a %d %b %Y %H:%M UTC}; {platform.node()} "
        f"{platform.release()}, nproc {os.cpu_count()}; {platform.python_version()} "
        f"({args.python}); load {loadavg()}"
    )
    with worktrees([a, b]):
        add_worktree(a)
        add_worktree(b)
        harness = {"a": a, "b": b, "newer": newer(a, b), "own": None}[args.harness]
        print(f"A: {a.label} in {a.tree}\nB: {b.label} in {b.tree}")
        comparison = Comparison(args, a, b, harness, root)
        if harness is None:
            print("bench scripts: each side its own")
        else:
            print(f"bench scripts: {harness.key}'s ({harness.label}), on both sides")
        for rel in HELPERS:
            pa, pb = a.tree / rel, b.tree / rel
            if pa.exists() and pb.exists() and not filecmp.cmp(pa, pb, shallow=False):
                comparison.note(f"{rel} differs between the sides: each side uses its own")
        try:
            for bench in args.benches:
                comparison.bench(bench)
        except (Interrupted, KeyboardInterrupt) as stop:
            print(f"\ninterrupted ({stop or 'SIGINT'}): removing the worktrees", file=sys.stderr)
            return 130
    if args.check:
        shutil.rmtree(root, ignore_errors=True)
        return 2 if comparison.failed else 0
    elapsed = time.monotonic() - started
    rows = rows_of(comparison.runs)
    lines, worse = table(rows, a, b, args.tolerance)
    print()
    print(
        f"{args.rounds} round(s) per side, interleaved A, B; "
        + ("quick sizes; " if args.quick else "")
        + "median (min–max); same = ranges overlap, or medians within "
        + f"{args.tolerance:.0%} or one printed digit; "
        + f"load at the end {loadavg()}; {elapsed / 60:.1f} min in all"
    )
    if args.quick or args.rounds < 3:
        print("quick sizes or fewer than 3 rounds: a smoke test of the harness, not a measurement")
    print()
    print("\n".join(lines))
    if comparison.notes:
        print("\nnotes:")
        print("\n".join(f"* {n}" for n in comparison.notes))
    kuik_rows = [r for r in rows if not r.reference and r.a and r.b]
    print(
        f"\n{len(kuik_rows)} kuikproxy figures compared: "
        + (f"{len(worse)} WORSE: " + "; ".join(worse) if worse else "none worse")
        + ("; some runs failed or were skipped (see the notes)" if comparison.failed else "")
    )
    print(f"logs: {root / 'logs'}")
    report = {
        "a": {"ref": a.ref, "commit": a.commit, "label": a.label},
        "b": {"ref": b.ref, "commit": b.commit, "label": b.label},
        "harness": harness.key if harness else "own",
        "rounds": args.rounds,
        "quick": args.quick,
        "notes": comparison.notes,
        "runs": [run_json(run) for run in comparison.runs],
    }
    (root / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    if comparison.failed:
        return 2
    return 1 if worse else 0


def run_json(run: Run) -> dict[str, Any]:
    return {
        "bench": run.bench,
        "side": run.side,
        "round": run.round,
        "script": run.script,
        "seconds": round(run.seconds, 1),
        "status": run.status,
        "loadavg": run.loadavg,
        "figures": {f.name: f.value for f in run.figures},
    }


if __name__ == "__main__":
    sys.exit(main())
