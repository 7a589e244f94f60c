"""Reports: a Markdown summary per run and per session, threshold candidates, and history plots (one PNG
per gated metric and series; matplotlib is imported only there)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
from pathlib import Path

from rlsmoke import history
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.runkey import SERIES

SUMMARY_MD = "summary.md"
SESSION_HEADER = "# rlsmoke runs"  # the first line of the session's summary.md: a file without it is not ours


def _fmt(x) -> str:
    return "missing" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


def write_run_summary(folder: Path, verdict, bands=(), *, shadow: bool = False) -> None:
    """`summary.md` beside the run's `summary.json`: the key, every gate and band, and where the logs are."""
    key = verdict.key.text()
    lines = [f"# {verdict.key.case}: {'PASS' if verdict.passed else 'FAIL'}", "", f"`{key}`", "",
             "| gate | metric | value | bound | margin | result | provenance |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in verdict.results:
        lines.append(f"| {r.gate.name} | `{r.gate.summary_key}` | {_fmt(r.value)} | {r.gate.op} {r.gate.bound:.4g} | "
                     f"{_fmt(r.margin)} | {'PASS' if r.passed else 'FAIL'} | {r.gate.provenance} |")  # fmt: skip
    if bands:
        lines += ["", "| history band | value | band | trusted runs | result |", "|---|---|---|---|---|"]
        for b in bands:
            lines.append(f"| `{b.metric}` | {b.value:.4g} | [{b.lower:.4g}, {b.upper:.4g}] | {b.runs} | "
                         f"{'PASS' if b.passed else 'FAIL (shadow)' if shadow else 'FAIL'} |")  # fmt: skip
    lines += ["", f"Artifacts: `{folder}` (run.log, metrics.jsonl, summary.json)", ""]
    (Path(folder) / SUMMARY_MD).write_text("\n".join(lines))


def write_session_summary(root: Path) -> Path | None:
    """One table of every run under the artifacts folder `root` (each run's `summary.json`): `summary.md`."""
    runs = []
    for path in sorted(root.rglob("summary.json")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # a hidden folder holds no test's run (the shared runs a test copies from, a staging folder)
        with contextlib.suppress(OSError, json.JSONDecodeError):
            runs.append((path.parent, json.loads(path.read_text())))
    if not runs:
        return None
    lines = [SESSION_HEADER, "", "| run | case | platform | device | launcher | verdict | failed gates |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for folder, s in runs:
        failed = ", ".join(g["name"] for g in s.get("gates", []) if not g.get("passed")) or "-"
        lines.append(f"| [{folder.relative_to(root)}]({folder.relative_to(root)}/{SUMMARY_MD}) | {s.get('case')} | "
                     f"{s.get('platform')} | {s.get('device')} | {s.get('launcher')} | {s.get('verdict', '?')} | "
                     f"{failed} |")  # fmt: skip
    path = root / SUMMARY_MD
    path.write_text("\n".join(lines) + "\n")
    return path


def write_threshold_candidate(folder: Path, record, verdict) -> Path:
    """`--update-golden`: this run's values as a thresholds entry, for review (never written in place)."""
    gates = [{"name": r.gate.name, "metric": r.gate.metric, "op": r.gate.op, "bound": r.gate.bound,
              "reduce": r.gate.reduce, "max_observed": r.value} for r in verdict.results]  # fmt: skip
    entry = {"key": verdict.key.to_json(), "gates": gates,
             "provenance": {"status": "candidate", "runs": 1, "device": verdict.key.device,
                            "date": dt.date.today().isoformat(), "versions": record.meta.get("versions", "?"),
                            "margin_rule": "review: set each bound from max_observed over >= 5 runs"}}  # fmt: skip
    path = Path(folder) / "thresholds-candidate.json"
    path.write_text(json.dumps({"schema_version": 1, "entries": [entry]}, indent=2) + "\n")
    return path


# --- rlsmoke report --history DB ------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def series(runs: list[dict]) -> tuple[dict[tuple, dict[str, list]], dict[tuple, dict[str, tuple]]]:
    """{(case, platform, device, launcher): {metric: [(run id, value, trusted)]}} over band and gate metrics,
    and per series the latest hard bound of each gated metric: {key: {metric: (op, bound)}}."""
    points: dict[tuple, dict[str, list]] = {}
    bounds: dict[tuple, dict[str, tuple[str, float]]] = {}
    for run in runs:
        key = tuple(run[f] for f in SERIES)
        metrics = points.setdefault(key, {})
        gated = {g["metric"]: g["value"] for g in run["gates"] if g.get("value") is not None}
        for metric, value in (gated | run["metrics"]).items():  # a value the run stored wins over its gate's
            metrics.setdefault(metric, []).append((run["id"], value, bool(run["trusted"])))
        bounds.setdefault(key, {}).update({g["metric"]: (g["op"], g["bound"]) for g in run["gates"]})
    return points, bounds


def plot_history(db: Path, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    all_points, limits = series(history.runs(db))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, metrics in all_points.items():
        for metric, points in sorted(metrics.items()):
            fig, ax = plt.subplots(figsize=(7, 3.5))
            xs = list(range(len(points)))
            ax.plot(xs, [v for _, v, _ in points], "-", color="0.6", zorder=1)
            ax.scatter([x for x, p in zip(xs, points, strict=True) if p[2]], [p[1] for p in points if p[2]],
                       color="tab:blue", label="trusted", zorder=2)  # fmt: skip
            ax.scatter([x for x, p in zip(xs, points, strict=True) if not p[2]], [p[1] for p in points if not p[2]],
                       color="tab:orange", marker="x", label="untrusted", zorder=2)  # fmt: skip
            # the band each run was judged against: its trusted predecessors (none for a metric without one)
            judged = {}  # run index -> its band
            for i, (_, value, _) in enumerate(points):
                past = [{metric: v} for _, v, t in points[:i] if t][-history.DEFAULT_K :]
                for band in history.check_bands({metric: value}, past):  # one, or none without a baseline
                    judged[i] = band
            if judged:
                lows, highs = [b.lower for b in judged.values()], [b.upper for b in judged.values()]
                ax.fill_between(list(judged), lows, highs, color="tab:blue", alpha=0.12, label="history band")
            op, bound = limits[key].get(metric, ("", math.nan))
            if math.isfinite(bound):
                ax.axhline(bound, color="tab:red", linestyle="--", label=f"threshold {op} {bound:.3g}")
            ax.set_xticks(xs, [str(i) for i, _, _ in points], fontsize=7)
            ax.set_xlabel("run id")
            ax.set_title(f"{metric}\n{' / '.join(key)}", fontsize=9)
            ax.legend(fontsize=7, loc="best")
            fig.tight_layout()
            path = out / f"{_slug('_'.join(key))}__{_slug(metric)}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


def handler(args) -> int:
    from rlsmoke.paths import check_dir, check_name

    if not (db := check_name(args.history, "--history")).is_file():
        what = "is not a file" if db.exists() else "does not exist"
        raise RlsmokeError(f"history={db} {what}", rule="report.history",
                           fix="pass the sqlite file written by `pytest --history DB`")  # fmt: skip
    check_dir(args.out, "--out", must_exist=False, fix="pass --out a folder for the PNGs (made if missing)")
    paths = plot_history(db, Path(args.out))
    for p in paths:
        print(p)
    print(f"{len(paths)} plots in {args.out}")
    return ExitCode.OK


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="plot each gated metric of a history DB over time, with its threshold"
    )
    p.add_argument(
        "--history", required=True, metavar="DB", help="sqlite history written by `pytest --history DB`"
    )
    p.add_argument(
        "--out", default="rlsmoke-report", metavar="DIR", help="folder for the PNGs (default rlsmoke-report)"
    )
    p.set_defaults(func=handler)
