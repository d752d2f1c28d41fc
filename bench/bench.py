#!/usr/bin/env python3
"""How fast is `ampmigrate check` on a large real tree? One run, every number, stdout and JSON.

    python bench/bench.py                      # the installed torch package + a 10k-file monorepo
    python bench/bench.py --tree PATH          # another tree
    python bench/bench.py --synthetic 0        # skip the synthetic monorepo
    python bench/bench.py --torchfix PATH      # time TorchFix too (a `torchfix` executable)
    python bench/bench.py --resume             # after an interruption: keep the stages done

What it measures, in this order, all in the same run:

1. the tree's file count (what `check` discovers), and how many files pass the pre-filter's text
   stage (rule triggers) and its `ast` name screen (the only files LibCST parses);
2. the parse floor: one process running `libcst.parse_module` over every one of those files;
3. `ampmigrate check` cold (a new, empty cache directory each time) and warm (the same files
   again, nothing changed), at `-j 1`, `-j 2` and the default jobs; every configuration runs
   `--repeat` times (default 2) and the fastest counts; wall time of the whole command,
   interpreter start-up included; cold and warm must print the same findings;
4. peak RSS: the largest single process of a cold default run (wait4), and the sum over the
   process and its workers, sampled from /proc (Linux) in a separate untimed run;
5. a synthetic monorepo: real legacy-AMP training files (this repository's fixtures and
   reference migrations) copied, each with its own name, directory and a line of its own, to
   `--synthetic` files (default 10,000) and to a tenth of that; cold and warm time, peak RSS of
   both sizes (the goal: 10x the files within 2x the memory);
6. TorchFix on the same tree when a `torchfix` executable is given, on PATH, or importable;
7. ruff (`ruff check --select ALL`, cold with `--no-cache` and warm) on the same tree, when a
   `ruff` executable is given, on PATH or beside this Python (`pip install ruff`; it is not a
   dependency of ampmigrate);
8. one large file full of legacy AMP code (bench/big_amp_file.py, `--big-file` lines): CPU time
   of `check` on it against LibCST's parse of it (every per-file stage must be linear).

Before anything is timed, the bytecode of ampmigrate's modules is written (as installing the
package does), so that a checkout without it (a new worktree, PYTHONDONTWRITEBYTECODE) does not
time the compilation of its own source at every run's start.

The goals (issues 6 and 14) are printed as ratios: cold default <= 0.15 x parse floor, warm
default <= 0.04 x parse floor, cold default no slower than ruff cold, `-j 2` >= 1.6x faster than
`-j 1` cold, peak RSS(10k) <= 2 x peak RSS(1k), the large file's check <= 3 x its parse.
The tree is checked with `respect-gitignore = false` (an installed package usually sits in an
ignored virtual environment); nothing is cached between bench runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ampmigrate import __version__  # noqa: E402
from ampmigrate.config import load_settings  # noqa: E402
from ampmigrate.discovery import discover  # noqa: E402
from ampmigrate.engine.cache import code_fingerprint  # noqa: E402
from ampmigrate.engine.pipeline import Engine  # noqa: E402
from ampmigrate.source import SourceError, SourceFile  # noqa: E402

# Issue 14 tightened issue 6's goals and added ruff and the per-file linearity goal.
GOALS = {"cold_vs_floor": 0.15, "warm_vs_floor": 0.04, "j2_speedup": 1.6, "rss_10x_files": 2.0,
         "cold_vs_ruff": 1.0, "big_file_vs_parse": 3.0, "index_overhead": 0.10}

_FLOOR_SCRIPT = r"""
import json, sys, time
import libcst
sys.path.insert(0, sys.argv[1])
from ampmigrate.source import SourceFile
paths = sys.stdin.read().splitlines()
failed = 0
start = time.perf_counter()
for path in paths:
    try:
        libcst.parse_module(SourceFile.read(path).text)
    except Exception:
        failed += 1
print(json.dumps({"seconds": time.perf_counter() - start, "files": len(paths), "failed": failed}))
"""

# One large legacy-AMP file (bench/big_amp_file.py): CPU time of LibCST's parse of it against
# the CPU time of checking it (pre-filter, parse, name pass, rules, positions), one process.
_BIG_FILE_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/bench")
import libcst
from big_amp_file import big_file
from ampmigrate.config import Settings
from ampmigrate.engine.pipeline import Engine
text = big_file(int(sys.argv[2]))
engine = Engine(Settings())
engine.check_text("x = 1\n", "warmup.py")
parse = check = float("inf")
for _ in range(int(sys.argv[3])):
    start = time.process_time()
    libcst.parse_module(text)
    parse = min(parse, time.process_time() - start)
    start = time.process_time()
    result = engine.check_text(text, "big.py", rules=engine.rules_for(text))
    check = min(check, time.process_time() - start)
print(json.dumps({"lines": text.count("\n"), "parse_cpu_seconds": parse, "check_cpu_seconds": check,
                  "findings": len(result.findings), "errors": [str(e) for e in result.errors]}))
"""


# ---------------------------------------------------------------------------------- helpers
def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def torch_tree() -> Optional[str]:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return os.path.dirname(spec.origin)


def machine() -> Dict[str, object]:
    info: Dict[str, object] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "ampmigrate": __version__,
    }
    try:
        from importlib.metadata import version

        info["libcst"] = version("libcst")
    except Exception:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
        info["load_average_at_start"] = list(os.getloadavg())
    except OSError:
        pass
    return info


class _RssSampler(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants, read from /proc."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._done = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _tree_rss(self) -> int:
        parents: Dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as handle:
                        fields = handle.read().rsplit(b")", 1)[1].split()
                    parents[int(entry)] = int(fields[1])
                except (OSError, IndexError, ValueError):
                    continue
        tree = {self.pid}
        grew = True
        while grew:
            grew = False
            for pid, parent in parents.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        total = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    total += int(handle.read().split()[1]) * self._page
            except (OSError, IndexError, ValueError):
                continue
        return total

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._tree_rss())
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def run_command(cmd: Sequence[str], *, stdout_path: str, sample_rss: bool = False, stdin: Optional[str] = None) -> Dict[str, object]:
    """Run `cmd`; wall seconds, exit code, and peak RSS (largest process; summed if sampled)."""
    env = {k: v for k, v in os.environ.items() if k != "AMPMIGRATE_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with open(stdout_path, "wb") as out, open(stdout_path + ".stderr", "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.PIPE if stdin is not None else None, env=env)
        sampler = None
        if sample_rss and os.path.isdir("/proc"):
            sampler = _RssSampler(proc.pid)
            sampler.start()
        if stdin is not None:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    result: Dict[str, object] = {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,  # the command and all its workers
        "exit": proc.returncode,
        # ru_maxrss is KiB on Linux, bytes on macOS; the largest process of the tree that ran.
        "max_process_rss_mib": usage.ru_maxrss / (1024 if sys.platform != "darwin" else 1024 * 1024),
    }
    if sampler is not None:
        result["tree_rss_mib"] = sampler.stop() / (1024 * 1024)
    return result


def findings_of(path: str) -> List[str]:
    return sorted(line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if ": AMP" in line)


def compile_package() -> int:
    """Write the bytecode of ampmigrate's modules, as installing the package does: a checkout
    run under PYTHONDONTWRITEBYTECODE (or a fresh git worktree) would otherwise compile about 130
    modules from source at every cold run's start, 0.2 s that an installed ampmigrate never pays.
    The number of modules compiled now (those whose bytecode was missing or stale)."""
    import py_compile
    from importlib.util import cache_from_source

    compiled = 0
    for source in sorted((REPO / "ampmigrate").rglob("*.py")):
        target = Path(cache_from_source(str(source)))
        if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
            continue
        try:
            py_compile.compile(str(source), cfile=str(target), doraise=True)
            compiled += 1
        except (OSError, py_compile.PyCompileError):
            pass  # a read-only checkout: the runs compile in memory, as before
    return compiled


# ---------------------------------------------------------------------------------- measurements
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        os.makedirs(args.work_dir, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="run-", dir=args.work_dir)
        self.config = os.path.join(self.work, "pyproject.toml")
        Path(self.config).write_text("[tool.ampmigrate]\nrespect-gitignore = false\n", encoding="utf-8")
        self.settings = load_settings(self.config)
        self._runs = 0

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def files(self, tree: str) -> List[str]:
        return discover([tree], self.settings).files

    def prefilter_counts(self, files: Sequence[str]) -> Dict[str, int]:
        engine = Engine(self.settings)
        triggered = screened = 0
        for path in files:
            try:
                text = SourceFile.read(path).text
            except SourceError:
                continue
            if engine.rules_for(text, path, screen=False):
                triggered += 1
                if engine.rules_for(text, path):
                    screened += 1
        return {"passed_triggers": triggered, "passed_name_screen": screened}

    def parse_floor(self, files: Sequence[str]) -> Dict[str, object]:
        out = os.path.join(self.work, "floor.json")
        run = run_command([sys.executable, "-c", _FLOOR_SCRIPT, str(REPO)], stdout_path=out, stdin="\n".join(files))
        if run["exit"] != 0:
            raise SystemExit(f"parse floor failed: {Path(out + '.stderr').read_text()}")
        floor = json.loads(Path(out).read_text())
        floor["cpu_seconds"] = run["cpu_seconds"]  # the whole process, start-up included
        return floor

    def check(self, tree: str, *, jobs: Optional[int], cache_dir: str, sample_rss: bool = False) -> Dict[str, object]:
        self._runs += 1
        out = os.path.join(self.work, f"check-{self._runs}.txt")
        cmd = [sys.executable, "-m", "ampmigrate", "check", tree, "--config", self.config,
               "--output-format", "concise", "--exit-zero", "--cache-dir", cache_dir]
        if jobs is not None:
            cmd += ["-j", str(jobs)]
        run = run_command(cmd, stdout_path=out, sample_rss=sample_rss)
        if run["exit"] not in (0, 2):  # 2: some file could not be checked (reported, not fatal)
            raise SystemExit(f"check failed ({run['exit']}): {Path(out + '.stderr').read_text()[-2000:]}")
        run["findings"] = findings_of(out)
        run["errors"] = sum(1 for line in Path(out + ".stderr").read_text().splitlines() if line.startswith("error:"))
        return run

    def check_configs(self, tree: str, job_counts: Sequence[Optional[int]], repeat: int) -> Dict[str, Dict[str, object]]:
        """Cold and warm runs for each job count; the fastest of `repeat` runs counts."""
        results: Dict[str, Dict[str, object]] = {}
        reference: Optional[List[str]] = None
        for jobs in job_counts:
            label = f"j{jobs}" if jobs else "default"
            colds, warms = [], []
            for attempt in range(repeat):
                cache_dir = tempfile.mkdtemp(prefix="cache-", dir=self.work)
                log(f"check {label} cold #{attempt + 1}")
                colds.append(self.check(tree, jobs=jobs, cache_dir=cache_dir))
                log(f"check {label} warm #{attempt + 1}")
                warms.append(self.check(tree, jobs=jobs, cache_dir=cache_dir))
                shutil.rmtree(cache_dir, ignore_errors=True)
            for run in colds + warms:
                if reference is None:
                    reference = run["findings"]
                elif run["findings"] != reference:
                    raise SystemExit(f"check {label}: findings differ between runs (cold/warm or jobs)")
            results[label] = {
                "cold_seconds": min(r["seconds"] for r in colds),
                "warm_seconds": min(r["seconds"] for r in warms),
                "cold_cpu_seconds": min(r["cpu_seconds"] for r in colds),
                "warm_cpu_seconds": min(r["cpu_seconds"] for r in warms),
                "cold_runs": [round(r["seconds"], 3) for r in colds],
                "warm_runs": [round(r["seconds"], 3) for r in warms],
                "max_process_rss_mib": max(r["max_process_rss_mib"] for r in colds),
            }
        results["findings"] = len(reference or [])
        results["file_errors"] = colds[0]["errors"] if job_counts else 0
        return results

    def ruff(self, tree: str, command: str, repeat: int) -> Dict[str, object]:
        """`ruff check --select ALL` on the tree: cold (no cache) and warm (its cache filled)."""
        cold, warm = [], []
        cache_dir = tempfile.mkdtemp(prefix="ruff-cache-", dir=self.work)
        base = [command, "check", "--select", "ALL", "--exit-zero", "--quiet", "--isolated", tree]
        for attempt in range(repeat):
            log(f"ruff cold #{attempt + 1}")
            cold.append(run_command([*base, "--no-cache"], stdout_path=os.path.join(self.work, "ruff.txt")))
            log(f"ruff warm #{attempt + 1}")
            run_command([*base, "--cache-dir", cache_dir], stdout_path=os.path.join(self.work, "ruff.txt"))
            warm.append(run_command([*base, "--cache-dir", cache_dir], stdout_path=os.path.join(self.work, "ruff.txt")))
        version = subprocess.run([command, "--version"], capture_output=True, text=True).stdout.strip()
        return {"version": version, "cold_seconds": min(r["seconds"] for r in cold),
                "cold_cpu_seconds": min(r["cpu_seconds"] for r in cold), "warm_seconds": min(r["seconds"] for r in warm),
                "cold_runs": [round(r["seconds"], 3) for r in cold], "warm_runs": [round(r["seconds"], 3) for r in warm]}

    def big_file(self, lines: int, repeat: int) -> Dict[str, object]:
        out = os.path.join(self.work, "big.json")
        log(f"one {lines}-line legacy-AMP file: parse vs check")
        run = run_command([sys.executable, "-c", _BIG_FILE_SCRIPT, str(REPO), str(lines), str(repeat)], stdout_path=out)
        if run["exit"] != 0:
            raise SystemExit(f"big file failed: {Path(out + '.stderr').read_text()[-2000:]}")
        return json.loads(Path(out).read_text())

    def project_index(self, tree: str, files: Sequence[str], repeat: int) -> Dict[str, float]:
        """The project index `check` builds before its per-file pass (engine/project_index.py):
        cold (no cache file) and warm (its cache file written), in this process, fastest of `repeat`."""
        from ampmigrate.engine.project_index import ProjectIndex

        colds, warms = [], []
        for _ in range(repeat):
            cache_path = os.path.join(tempfile.mkdtemp(prefix="index-", dir=self.work), "project-index.json")
            start = time.perf_counter()
            ProjectIndex.build(tree, files, cache_path=cache_path, max_size=self.settings.max_file_size)
            colds.append(time.perf_counter() - start)
            start = time.perf_counter()
            ProjectIndex.build(tree, files, cache_path=cache_path, max_size=self.settings.max_file_size)
            warms.append(time.perf_counter() - start)
        return {"cold_seconds": min(colds), "warm_seconds": min(warms)}

    def peak_tree_rss(self, tree: str) -> float:
        cache_dir = tempfile.mkdtemp(prefix="cache-", dir=self.work)
        log("peak RSS run (cold, default jobs, sampled)")
        run = self.check(tree, jobs=None, cache_dir=cache_dir, sample_rss=True)
        shutil.rmtree(cache_dir, ignore_errors=True)
        return float(run.get("tree_rss_mib", run["max_process_rss_mib"]))

    def torchfix(self, tree: str, command: List[str]) -> Dict[str, object]:
        out = os.path.join(self.work, "torchfix.txt")
        log(f"torchfix {' '.join(command)} (default jobs)")
        run = run_command([*command, tree], stdout_path=out)
        lines = Path(out).read_text(errors="replace").splitlines()
        return {"seconds": run["seconds"], "exit": run["exit"], "findings": sum(1 for line in lines if ": TOR" in line),
                "command": command}


# ---------------------------------------------------------------------------------- synthetic monorepo
def seed_files() -> List[Path]:
    """Real legacy-AMP training loops: the fixtures' inputs and the reference migrations' inputs."""
    seeds = [p for p in sorted((REPO / "tests" / "fixtures").rglob("*.py")) if not p.name.endswith(".expected.py")]
    seeds += sorted((REPO / "examples").rglob("*.py")) if (REPO / "examples").is_dir() else []
    return seeds


def build_monorepo(root: Path, count: int) -> None:
    """`count` copies of the seeds, each in its own team/project directory with its own name and
    a line that makes its bytes unique (a real monorepo has no two files alike)."""
    seeds = [(p, p.read_bytes()) for p in seed_files()]
    for index in range(count):
        seed, data = seeds[index % len(seeds)]
        directory = root / f"team_{index % 41:02d}" / f"project_{index % 257:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        if not data.endswith(b"\n"):
            data += b"\n"
        (directory / f"{seed.stem}_{index:05d}.py").write_bytes(data + f"# synthetic copy {index} of {seed.name}\n".encode())


# ---------------------------------------------------------------------------------- report
def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if not numerator or not denominator:
        return None
    return numerator / denominator


def render(results: Dict[str, object]) -> str:
    def fmt(value, unit="", digits=2):
        return "n/a" if value is None else f"{value:.{digits}f}{unit}"

    def verdict(value, goal, at_most=True):
        if value is None:
            return ""
        ok = value <= goal if at_most else value >= goal
        return "PASS" if ok else "FAIL"

    m = results["machine"]
    t = results["tree"]
    c = t["check"]
    default = c.get("default") or c.get("j2") or c["j1"]
    lines = [
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('memory_gib', '?')} GiB; {m['platform']}; "
        f"Python {m['python']}, libcst {m.get('libcst', '?')}, ampmigrate {m['ampmigrate']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in m.get('load_average_at_start', []))}",
        f"Tree: {t['path']}",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| files | {t['files']} ({t['lines']:,} lines) |",
        f"| files passing the trigger regexes | {t['prefilter']['passed_triggers']} |",
        f"| files passing the `ast` name screen (parsed by LibCST) | {t['prefilter']['passed_name_screen']} |",
        f"| parse floor: `libcst.parse_module` over every file, one process | {fmt(t['floor']['seconds'], ' s')} (CPU {fmt(t['floor'].get('cpu_seconds'), ' s')}) |",
    ]
    for label in ("j1", "j2", "default"):
        if label in c and not (label == "default" and c[label] is c.get("j2")) and not (
            label == "default" and m["cpus"] == 2
        ):
            name = {"j1": "`-j 1`", "j2": "`-j 2`" + (" = default jobs" if m["cpus"] == 2 else ""),
                    "default": f"default jobs ({m['cpus']})"}[label]
            cpu = c[label].get("cold_cpu_seconds")
            lines.append(f"| `check` cold, {name} | {fmt(c[label]['cold_seconds'], ' s')} (CPU {fmt(cpu, ' s')}) |")
            lines.append(f"| `check` warm, {name} | {fmt(c[label]['warm_seconds'], ' s')} (CPU {fmt(c[label].get('warm_cpu_seconds'), ' s')}) |")
    lines.append(f"| findings | {c['findings']} |")
    lines.append(f"| peak RSS, cold default: largest process / all processes | {fmt(default['max_process_rss_mib'], ' MiB', 0)} / {fmt(t.get('tree_rss_mib'), ' MiB', 0)} |")
    r = results.get("ratios") or {}
    lines += [
        f"| cold default / parse floor (goal <= {GOALS['cold_vs_floor']}) | {fmt(r.get('cold_vs_floor'), '', 3)} {verdict(r.get('cold_vs_floor'), GOALS['cold_vs_floor'])} |",
        f"| warm default / parse floor (goal <= {GOALS['warm_vs_floor']}) | {fmt(r.get('warm_vs_floor'), '', 3)} {verdict(r.get('warm_vs_floor'), GOALS['warm_vs_floor'])} |",
        f"| the same in CPU time: cold / floor, warm / floor | {fmt(r.get('cold_cpu_vs_floor_cpu'), '', 3)}, {fmt(r.get('warm_cpu_vs_floor_cpu'), '', 3)} |",
        f"| cold `-j 1` / cold `-j 2` (goal >= {GOALS['j2_speedup']}) | {fmt(r.get('j2_speedup'))} {verdict(r.get('j2_speedup'), GOALS['j2_speedup'], at_most=False)} |",
    ]
    rf = results.get("ruff")
    if rf:
        lines += [
            f"| {rf['version']} `check --select ALL`: cold (no cache) / warm | {fmt(rf['cold_seconds'], ' s')} (CPU {fmt(rf['cold_cpu_seconds'], ' s')}) / {fmt(rf['warm_seconds'], ' s')} |",
            f"| cold default / ruff cold (goal <= {GOALS['cold_vs_ruff']}) | {fmt(r.get('cold_vs_ruff'))} {verdict(r.get('cold_vs_ruff'), GOALS['cold_vs_ruff'])} (CPU: {fmt(r.get('cold_cpu_vs_ruff_cpu'))}) |",
        ]
    big = results.get("big_file")
    if big:
        lines += [
            f"| one {big['lines']}-line legacy-AMP file: LibCST parse / `check` (CPU, best of runs) | {fmt(big['parse_cpu_seconds'], ' s')} / {fmt(big['check_cpu_seconds'], ' s')} ({big['findings']} findings) |",
            f"| that file: check / parse (goal <= {GOALS['big_file_vs_parse']}) | {fmt(r.get('big_file_vs_parse'))} {verdict(r.get('big_file_vs_parse'), GOALS['big_file_vs_parse'])} |",
        ]
    index = t.get("index")
    if index:
        lines += [
            f"| project index, cold / warm (in-process) | {fmt(index['cold_seconds'], ' s', 3)} / {fmt(index['warm_seconds'], ' s', 3)} |",
            f"| project index / rest of a cold `-j 1` check (goal <= {GOALS['index_overhead']}) | {fmt(r.get('index_overhead'), '', 3)} {verdict(r.get('index_overhead'), GOALS['index_overhead'])} |",
        ]
    tf = results.get("torchfix")
    if tf:
        lines.append(f"| TorchFix {tf.get('version', '')} on the same tree (default jobs) | {fmt(tf['seconds'], ' s')} ({tf['findings']} findings) |")
    s = results.get("synthetic")
    if s:
        small, large = s["small"], s["large"]
        lines += [
            f"| synthetic monorepo, {large['files']} files: cold / warm, default jobs | {fmt(large['cold_seconds'], ' s')} / {fmt(large['warm_seconds'], ' s')} ({large['files'] / large['cold_seconds']:.0f} files/s cold) |",
            f"| synthetic, peak RSS all processes: {small['files']} / {large['files']} files | {fmt(small['tree_rss_mib'], ' MiB', 0)} / {fmt(large['tree_rss_mib'], ' MiB', 0)} |",
            f"| RSS({large['files']}) / RSS({small['files']}) (goal <= {GOALS['rss_10x_files']}) | {fmt(r.get('rss_10x_files'))} {verdict(r.get('rss_10x_files'), GOALS['rss_10x_files'])} |",
        ]
    return "\n".join(lines)


def torchfix_command(args: argparse.Namespace) -> Optional[List[str]]:
    if args.torchfix:
        return [args.torchfix]
    if args.no_torchfix:
        return None
    if shutil.which("torchfix"):
        return [shutil.which("torchfix")]
    if importlib.util.find_spec("torchfix") is not None:
        return [sys.executable, "-m", "torchfix"]
    return None


def ruff_command(args: argparse.Namespace) -> Optional[str]:
    if args.no_ruff:
        return None
    if args.ruff:
        return args.ruff
    beside = Path(sys.executable).parent / "ruff"
    return shutil.which("ruff") or (str(beside) if beside.exists() else None)


def compute_ratios(results: Dict[str, Any]) -> Dict[str, Optional[float]]:
    tree = results["tree"]
    check, floor = tree["check"], tree["floor"]["seconds"]
    ratios = {
        "cold_vs_floor": ratio(check["default"]["cold_seconds"], floor),
        "warm_vs_floor": ratio(check["default"]["warm_seconds"], floor),
        "j2_speedup": ratio(check["j1"]["cold_seconds"], check["j2"]["cold_seconds"]),
        # The same in CPU time (the command and its workers against the floor's process): what
        # a busy machine, shared with other work, does not distort.
        "cold_cpu_vs_floor_cpu": ratio(check["default"]["cold_cpu_seconds"], tree["floor"].get("cpu_seconds")),
        "warm_cpu_vs_floor_cpu": ratio(check["default"].get("warm_cpu_seconds"), tree["floor"].get("cpu_seconds")),
    }
    if results.get("ruff"):
        ratios["cold_vs_ruff"] = ratio(check["default"]["cold_seconds"], results["ruff"]["cold_seconds"])
        ratios["cold_cpu_vs_ruff_cpu"] = ratio(check["default"]["cold_cpu_seconds"], results["ruff"]["cold_cpu_seconds"])
    if results.get("big_file"):
        big = results["big_file"]
        ratios["big_file_vs_parse"] = ratio(big["check_cpu_seconds"], big["parse_cpu_seconds"])
    index = tree.get("index")
    if index:
        # What the index adds to a cold `-j 1` check (whose time includes it): index / (check - index).
        ratios["index_overhead"] = ratio(index["cold_seconds"], check["j1"]["cold_seconds"] - index["cold_seconds"])
    synthetic = results.get("synthetic")
    if synthetic:
        ratios["rss_10x_files"] = ratio(synthetic["large"]["tree_rss_mib"], synthetic["small"]["tree_rss_mib"])
    return ratios


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", help="tree to check (default: the installed torch package)")
    parser.add_argument("--synthetic", type=int, default=10000, help="files in the synthetic monorepo (0: skip)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per check configuration; the fastest counts")
    parser.add_argument("--torchfix", help="a torchfix executable (default: on PATH or importable, if any)")
    parser.add_argument("--no-torchfix", action="store_true", help="do not time TorchFix")
    parser.add_argument("--ruff", help="a ruff executable to time beside (default: on PATH or next to this Python)")
    parser.add_argument("--no-ruff", action="store_true", help="do not time ruff")
    parser.add_argument("--big-file", type=int, default=6500, help="lines of the one large legacy-AMP file (0: skip)")
    parser.add_argument("--json", default=str(REPO / "bench" / "results.json"), help="where to write the results")
    parser.add_argument("--resume", action="store_true",
                        help="keep the stages already in --json (same tree, same ampmigrate source) and run the rest")
    parser.add_argument("--work-dir", default=str(REPO / "bench" / ".work"),
                        help="scratch space for caches, outputs and the synthetic monorepo (emptied afterwards)")
    args = parser.parse_args(argv)

    tree = args.tree or torch_tree()
    if tree is None:
        parser.error("torch is not installed; pass --tree")
    tree = os.path.abspath(tree)
    identity = {"tree": tree, "code": code_fingerprint(), "synthetic_files": args.synthetic, "big_file": args.big_file}
    results: Dict[str, Any] = {}
    if args.resume and Path(args.json).exists():
        previous = json.loads(Path(args.json).read_text(encoding="utf-8"))
        if previous.get("identity") == identity:
            results = previous
            log(f"resuming: {', '.join(k for k in ('tree', 'synthetic', 'torchfix') if k in results)} kept")
        else:
            log("not resuming: the tree, the ampmigrate source or the options changed")
    if not results:
        results = {"identity": identity, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                   "machine": machine(), "goals": GOALS, "complete": False}

    def save() -> None:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    compiled = compile_package()
    if compiled:
        log(f"compiled the bytecode of {compiled} ampmigrate modules (an installed package has it)")
    bench = Bench(args)
    try:
        t = results.setdefault("tree", {"path": tree})
        files = bench.files(tree)
        if "files" not in t:
            t["files"] = len(files)
            t["lines"] = sum(Path(p).read_bytes().count(b"\n") for p in files)
        log(f"{t['files']} files, {t['lines']} lines in {tree}")
        if "prefilter" not in t:
            t["prefilter"] = bench.prefilter_counts(files)
            save()
        log(f"pre-filter: {t['prefilter']}")
        if "floor" not in t:
            log("parse floor (libcst.parse_module over every file, one process)")
            t["floor"] = bench.parse_floor(files)
            save()
        log(f"parse floor: {t['floor']['seconds']:.1f} s")
        if "check" not in t:
            job_counts: List[Optional[int]] = [1, 2] + ([None] if (os.cpu_count() or 1) != 2 else [])
            check = bench.check_configs(tree, job_counts, args.repeat)
            if "default" not in check:
                check["default"] = check["j2"]
            t["check"] = check
            save()
        ruff = ruff_command(args)
        if ruff and "ruff" not in results:
            results["ruff"] = bench.ruff(tree, ruff, args.repeat)
        if "index" not in t:
            log("project index, cold and warm")
            t["index"] = bench.project_index(tree, files, args.repeat)
            save()
        if "tree_rss_mib" not in t:
            t["tree_rss_mib"] = bench.peak_tree_rss(tree)
            save()
        if args.big_file and "big_file" not in results:
            results["big_file"] = bench.big_file(args.big_file, max(2, args.repeat))
            save()
        results["ratios"] = compute_ratios(results)
        if args.synthetic and "synthetic" not in results:
            synthetic = {}
            for label, count in (("small", max(1, args.synthetic // 10)), ("large", args.synthetic)):
                root = Path(bench.work) / f"monorepo-{count}"
                build_monorepo(root, count)
                log(f"synthetic monorepo: {count} files")
                cache_dir = tempfile.mkdtemp(prefix="cache-", dir=bench.work)
                cold = bench.check(str(root), jobs=None, cache_dir=cache_dir, sample_rss=True)
                warm = bench.check(str(root), jobs=None, cache_dir=cache_dir)
                synthetic[label] = {"files": count, "cold_seconds": cold["seconds"], "cold_cpu_seconds": cold["cpu_seconds"],
                                    "warm_seconds": warm["seconds"],
                                    "tree_rss_mib": cold.get("tree_rss_mib", cold["max_process_rss_mib"]),
                                    "max_process_rss_mib": cold["max_process_rss_mib"], "findings": len(cold["findings"])}
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(cache_dir, ignore_errors=True)
            results["synthetic"] = synthetic
            results["ratios"] = compute_ratios(results)
            save()
        command = torchfix_command(args)
        if command and "torchfix" not in results:
            tf = bench.torchfix(tree, command)
            try:
                tf["version"] = subprocess.run([*command, "--version"], capture_output=True, text=True).stdout.strip()
            except OSError:
                pass
            results["torchfix"] = tf
            save()
        results["complete"] = True
        save()
    finally:
        bench.close()
    print(render(results))
    log(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
