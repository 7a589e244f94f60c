"""Thresholds from repeated runs: `rlsmoke calibrate RUN_DIR... [--write FILE]`.

Runs (a `rlsmoke run --repeat K` folder, or a suite run's artifacts) are grouped by run key; each key
gets its gates with bounds by MARGIN_RULE and the seeds' min / median / max as provenance.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from datetime import date
from pathlib import Path

from rlsmoke import metrics, thresholds
from rlsmoke.artifacts import write_atomic
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.paths import check_dir, check_file, check_name, from_os_error
from rlsmoke.runkey import RunKey

DIFF_FACTOR = 2.0  # upper bounds: twice the worst seed
REWARD_LOW, REWARD_HIGH = 0.5, 1.5  # reward range: half the lowest, 1.5x the highest (at most 1)
MARGIN_RULE = (
    f"upper bounds on diff/kl metrics = {DIFF_FACTOR:g}x the max over the seeds (of the magnitude, for the "
    f"signed log-prob mean diff), rounded up to 2 significant digits; reward range = [{REWARD_LOW:g}x min, "
    f"{REWARD_HIGH:g}x max] capped at [0, 1]; ppo_kl at step 0, grad_norm and the weight sync keep their "
    "definitional bounds"
)
DEFINITIONAL = {"ppo_kl_step0", "pg_clipfrac_step0", "grad_norm", "weight_sync"}
MIN_CALIBRATED_RUNS = 10


def round_sig(x: float, up: bool) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    exp = math.floor(math.log10(abs(x))) - 1
    scaled = round(x / 10**exp, 9)  # 0.10000000000000009 is 0.1: float noise must not round up a digit
    rounded = (math.ceil(scaled) if up else math.floor(scaled)) * 10**exp
    return float(f"{rounded:.3g}")  # no 0.35000000000000003


# RunKey's fields a summary names as text
KEY_TEXT_FIELDS = ("case", "platform", "device", "launcher", "width")


def summary_of(run: Path) -> tuple[dict, RunKey]:
    """The run's summary.json, an object whose key fields have the types a key needs, and that key."""
    path = check_name(Path(run) / "summary.json", "run")
    fix = "pass `rlsmoke run --out` folders or the suite's artifacts folders"
    if not path.is_file():
        raise RlsmokeError(f"run={run} has no summary.json", rule="calibrate.summary", fix=fix)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RlsmokeError(f"run={run}: summary.json is not JSON ({exc})", rule="calibrate.summary",
                           fix=f"{fix}; a run that was cut short wrote no complete summary: run it again") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise RlsmokeError(f"run={run}: summary.json is a JSON {type(doc).__name__}, not an object",
                           rule="calibrate.summary", fix=fix)  # fmt: skip
    wrong = [
        f"{k}={doc[k]!r}" for k in KEY_TEXT_FIELDS if doc.get(k) is not None and not isinstance(doc[k], str)
    ]
    if wrong:
        raise RlsmokeError(f"run={run}: summary.json has {', '.join(wrong)}, not text", rule="calibrate.summary",
                           fix="write those fields as strings, as `rlsmoke run` does")  # fmt: skip
    try:
        return doc, RunKey.from_summary(doc)
    except RlsmokeError:
        raise
    except (ValueError, TypeError) as exc:  # num_gpus "two" and the like
        raise RlsmokeError(f"run={run}: summary.json does not make a run key ({exc})", rule="calibrate.summary",
                           fix="write num_gpus as a count and the key fields as `rlsmoke run` does") from None  # fmt: skip


def records_of(run: Path) -> list[metrics.Record]:
    """Every seed's record of a run; a line that is not a JSON object of the right shape is named."""
    jsonl = Path(run) / "metrics.jsonl"
    fix = "run it again (a run cut short leaves a partial last line), or remove the run from the list"
    if jsonl.is_file():
        for number, line in enumerate(jsonl.read_text(errors="replace").splitlines(), 1):
            try:
                ok = not line.strip() or isinstance(json.loads(line), dict)
            except json.JSONDecodeError as exc:
                raise RlsmokeError(f"run={run}: metrics.jsonl line {number} is not JSON ({exc.msg})",
                                   rule="calibrate.metrics", fix=fix) from None  # fmt: skip
            if not ok:
                raise RlsmokeError(f"run={run}: metrics.jsonl line {number} is not an object", rule="calibrate.metrics",
                                   fix=fix)  # fmt: skip
    try:
        return metrics.seed_records(run)
    except RlsmokeError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # "index": "first", ...
        raise RlsmokeError(f"run={run}: metrics.jsonl has a line of the wrong shape ({type(exc).__name__}: {exc})",
                           rule="calibrate.metrics", fix=fix) from None  # fmt: skip


def template_for(key: RunKey, target: list[dict]) -> list[dict]:
    """The gates a key gets: its entry in the target file, else its runs', else one of the same case and
    launcher (MLA and GQA models have different gates)."""
    for entry in target:
        if thresholds.same_key(entry["key"], key.to_json()):
            return entry["gates"]
    found = thresholds.matching_entry(key.to_json())
    if found is not None:
        return found[1]["gates"]
    known = target + [e for _, e in thresholds.all_entries()]
    # the built-in engine's other trainers (builtin-megatron) run the same step: the same gates
    launchers = ("*", key.launcher, key.launcher.split("-")[0])
    for entry in known:
        if entry["key"].get("case") == key.case and entry["key"].get("launcher", "*") in launchers:
            return entry["gates"]
    raise RlsmokeError(f"no thresholds entry matches {key.text()} to take its gates from",
                       rule="calibrate.template",
                       fix="add an entry with the gates this key should have (see fixtures/thresholds/)")  # fmt: skip


def calibrate(runs: list[Path], template: list[dict]) -> tuple[dict, list[tuple]]:
    """One entry from all the runs of one key (e.g. two `--repeat 5` runs with different --seed)."""
    summary, key = summary_of(runs[0])
    records = [rec for run in runs for rec in records_of(run)]
    rows, gates, not_logged = [], [], []
    for tmpl in template:
        gate = {k: v for k, v in tmpl.items() if k not in ("max_observed", "provenance")}
        metric = thresholds.summary_key(gate["metric"], gate.get("reduce", "max"))
        values = [v for r in records if (v := r.value(gate["metric"], gate.get("reduce", "max"))) is not None]
        bad = [f"seed {i}: {v}" for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:  # a bound from a NaN is NaN, which no run passes and strict JSON cannot hold
            raise RlsmokeError(f"runs {', '.join(map(str, runs))} logged {gate['name']}'s metric {metric} as "
                               f"{', '.join(bad[:3])}", rule="calibrate.finite",
                               fix="calibrate from runs whose metrics are finite (a NaN is a broken run: see its run.log)")  # fmt: skip
        if not values:
            not_logged.append(gate["name"])  # no gate rather than a guessed one; the entry says so
            continue
        lo, med, hi = min(values), statistics.median(values), max(values)
        rows.append((gate["name"], metric, lo, med, hi))
        if gate["name"] in DEFINITIONAL:
            pass
        elif gate["op"] in ("<=", "<"):
            gate["bound"] = round_sig(DIFF_FACTOR * hi, up=True)
        elif gate["op"] == "abs<":  # a signed metric: twice the largest magnitude
            gate["bound"] = round_sig(DIFF_FACTOR * max(abs(lo), abs(hi)), up=True)
        elif gate["name"] == "reward_min":
            gate["bound"] = max(0.0, round_sig(REWARD_LOW * lo, up=False))
        elif gate["name"] == "reward_max":
            gate["bound"] = min(1.0, round_sig(REWARD_HIGH * hi, up=True))
        gate["max_observed"] = hi
        gate["provenance"] = f"{len(records)} seeds: min {lo:.4g}, median {med:.4g}, max {hi:.4g}"
        # a definitional gate keeps its own words, less the seed statistics of an earlier calibration
        if gate["name"] in DEFINITIONAL and "provenance" in tmpl:
            gate["provenance"] += "; " + re.sub(r"^(\d+ seeds: [^;]*; )+", "", tmpl["provenance"])
        gates.append(gate)
    if not gates:
        raise RlsmokeError(f"runs {', '.join(map(str, runs))} logged none of the gated metrics",
                           rule="calibrate.metrics", fix="pass the run folders of finished runs")  # fmt: skip
    versions = summary.get("versions") or {}
    calibrated = len(records) >= MIN_CALIBRATED_RUNS
    entry = {
        "key": key.to_json(),
        "provenance": {
            "status": "calibrated" if calibrated else f"provisional ({len(records)} runs)",
            "runs": len(records),
            "device": key.device,
            "date": date.today().isoformat(),
            "versions": ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded",
            "command": _command(key, len(records)),
            "margin_rule": MARGIN_RULE,
            "rollout_temperature": summary.get("rollout_temperature"),
        },
        "gates": gates,
    }
    # the rollout's log-probs are the decode's: a key calibrated on one judges runs of that one
    if ran := (summary.get("rollout_decode") or {}).get("ran"):
        entry["provenance"]["rollout_decode"] = "/".join(ran)
    if not_logged:
        entry["provenance"]["not_gated"] = f"{', '.join(not_logged)}: the runs did not log their metrics"
    return entry, rows


def _command(key: RunKey, runs: int) -> str:
    """The command that makes runs of `key`: what a thresholds entry's provenance names."""
    if not key.launcher.startswith("builtin"):
        return f"{runs} suite runs of {key.case} on {key.platform} (--launcher {key.launcher})"
    width = " --no-tiny" if key.platform == "cpu" and key.width != "tiny" else ""
    gpus = "" if key.num_gpus == "*" else f" --num-gpus {key.num_gpus}"
    trainer = " --trainer megatron" if key.launcher == "builtin-megatron" else ""
    return f"rlsmoke run {key.case} --platform {key.platform}{gpus}{trainer} --repeat {runs}{width}"


def markdown(entry: dict, rows: list[tuple]) -> str:
    k = entry["key"]
    head = (f"#### {k['case']} · {k['platform']} · {k['device']} · {k['dtype']} · {k['width']} "
            f"({entry['provenance']['runs']} seeds)\n\n")  # fmt: skip
    table = "| gate | metric | min | median | max | bound |\n|---|---|---|---|---|---|\n"
    bounds = {g["name"]: f"{g['op']} {g['bound']:.3g}" for g in entry["gates"]}
    for name, metric, lo, med, hi in rows:
        table += f"| {name} | `{metric}` | {lo:.4g} | {med:.4g} | {hi:.4g} | {bounds[name]} |\n"
    if "not_gated" in entry["provenance"]:
        table += f"\nNot gated: {entry['provenance']['not_gated']}.\n"
    return head + table


def read_target(path: Path) -> dict | None:
    """The thresholds file `--write` will update, or None when it does not exist yet."""
    path = check_name(path, "--write")
    if not path.exists():
        return None
    check_file(path, "--write", fix="pass --write a thresholds .json file (created if missing)")
    try:
        doc = thresholds.load_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RlsmokeError(f"thresholds={path} cannot be read as JSON ({type(exc).__name__})",
                           rule="thresholds.schema", fix="write to a new file, or repair this one") from None  # fmt: skip
    schema = thresholds.SCHEMA_VERSION
    if not isinstance(doc, dict) or doc.get("schema_version") != schema or "entries" not in doc:
        raise RlsmokeError(f"thresholds={path} is not a schema {schema} thresholds file",
                           rule="thresholds.schema", fix="write to a new file or fix its schema_version")  # fmt: skip
    return doc


def check_markdown(path: Path) -> None:
    """--markdown appends to a file: checked before --write writes anything."""
    path = check_name(path, "--markdown")
    if path.exists():
        check_file(path, "--markdown", fix="pass --markdown a file to append the tables to")
    else:
        check_dir(path.parent, "--markdown's folder", fix="pass --markdown a file in a folder that exists")


def write_entries(path: Path, new: list[dict], doc: dict | None) -> None:
    """Replace the entries of the same keys in `doc`, read from `path` (None: a new file), atomically."""
    if doc is None:
        doc = {"schema_version": thresholds.SCHEMA_VERSION,
               "header": {"what": "calibrated with `rlsmoke calibrate`", "margin_rule": MARGIN_RULE},
               "entries": []}  # fmt: skip
    keys = [e["key"] for e in new]
    kept = [e for e in doc["entries"] if not any(thresholds.same_key(e["key"], k) for k in keys)]
    doc["entries"] = kept + new
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise from_os_error(exc, "--write", path) from None


def run(runs: list[Path], write: Path | None = None, markdown_to: Path | None = None, *,
        min_seeds: int = 1) -> list[dict]:  # fmt: skip
    """Calibrate every key among `runs`, print, write when asked. Under `min_seeds` seeds is refused."""
    by_key: dict[RunKey, list[Path]] = {}
    for folder in runs:
        by_key.setdefault(summary_of(folder)[1], []).append(Path(folder))
    doc = read_target(write) if write else None  # checked before any work
    if markdown_to:
        check_markdown(markdown_to)
    target = doc["entries"] if doc else []
    entries, tables = [], []
    for key, folders in by_key.items():
        entry, rows = calibrate(folders, template_for(key, target))
        if entry["provenance"]["runs"] < min_seeds:
            raise RlsmokeError(f"{key.text()} has {entry['provenance']['runs']} seed(s), fewer than --min-seeds="
                               f"{min_seeds}", rule="calibrate.seeds",
                               fix=f"run more seeds (`{_command(key, 10)}`), or pass --min-seeds "
                                   f"{entry['provenance']['runs']} to accept these")  # fmt: skip
        entries.append(entry)
        tables.append(markdown(entry, rows))
    print(*tables, sep="\n")
    if write:
        write_entries(Path(write), entries, doc)
        print(f"wrote {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} to {write}")
    if markdown_to:
        try:
            with Path(markdown_to).open("a") as f:
                f.write("\n".join(tables) + "\n")
        except OSError as exc:
            raise from_os_error(exc, "--markdown", markdown_to) from None
    return entries


DEFAULT_MIN_SEEDS = 2


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="thresholds entries from repeated runs, by the stated margin rule"
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="`rlsmoke run --repeat K --out` folders, or the suite's artifacts folders")  # fmt: skip
    p.add_argument(
        "--write", type=Path, metavar="FILE", help="replace these keys' entries in FILE (created if missing)"
    )
    p.add_argument("--markdown", type=Path, metavar="FILE", help="append the distribution tables to FILE")
    p.add_argument("--min-seeds", type=_count, default=DEFAULT_MIN_SEEDS, metavar="N",
                   help=f"refuse a key with fewer seeds (default {DEFAULT_MIN_SEEDS}; "
                        f"{MIN_CALIBRATED_RUNS} make an entry 'calibrated', fewer 'provisional')")  # fmt: skip
    p.set_defaults(func=handler)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of at least 1")
    return int(text)


def handler(args) -> int:
    for folder in args.runs:
        check_name(folder, "run")
        if not folder.is_dir():
            raise RlsmokeError(f"run={folder} is not a folder", rule="calibrate.run",
                               fix="pass the --out folders of `rlsmoke run`")  # fmt: skip
    run(args.runs, write=args.write, markdown_to=args.markdown, min_seeds=args.min_seeds)
    return ExitCode.OK
