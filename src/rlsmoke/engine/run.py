"""One engine run: prepare, place, roll out, score, train, sync, roll out again (scored against the
trainer, so drift after a weight update is gated too), record."""

from __future__ import annotations

import gc
import json
import platform as pyplatform
import time
from pathlib import Path

import torch
import torch.utils.deterministic as det
import transformers

from rlsmoke.artifacts import RunLog, write_atomic
from rlsmoke.engine import decode, grpo, kda, signals
from rlsmoke.engine.config import Inject, RunConfig, Variant
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.model import checkpoint_dir, load_tokenizer
from rlsmoke.engine.placement import open_workers
from rlsmoke.engine.reward import REWARDS
from rlsmoke.engine.rollout import batch_for
from rlsmoke.engine.timing import PhaseClock, describe_timing, phase_seconds
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.memory import estimate, plan_of_run


def one_run(cfg: RunConfig, workers, prompts, tokenizer, seed: int, log: RunLog,
            clock: PhaseClock | None = None, decodes: set | None = None) -> list[dict]:  # fmt: skip
    """The GRPO loop for one seed; returns the metrics.jsonl lines."""
    lines = []
    score = REWARDS[cfg.reward]
    clock = clock or PhaseClock()
    prompt_ids = [p.ids for p in prompts]
    for i in range(cfg.num_rollout):
        groups = clock("rollout", workers.generate, prompt_ids, cfg.n_samples, seed=seed * 100 + i)
        if decodes is not None:
            decodes.update((g.decode, g.fallback) for g in groups)
        for g, p in zip(groups, prompts, strict=True):
            rows = [resp[mask > 0].tolist() for resp, mask in zip(g.response, g.mask, strict=True)]
            g.rewards = torch.tensor([score(tokenizer.decode(r), r, p.label) for r in rows])  # (n,)
        old = clock("forward_only", workers.forward_only, groups)  # [(logp (n, R), entropy (n, R))] per group
        old_lp = [lp for lp, _ in old]
        pairs = list(zip(groups, old, strict=True))
        # Groups hold the same n samples, so the mean of group means is the mean over samples.
        rollout = {
            "rollout/raw_reward": torch.cat([g.rewards for g in groups]).mean().item(),
            "rollout/log_probs": _mean(grpo.sample_mean(lp, g.mask) for g, (lp, _) in pairs),
            "rollout/rollout_log_probs": _mean(grpo.sample_mean(g.rollout_logprobs, g.mask) for g in groups),
            "rollout/entropy": _mean(grpo.sample_mean(ent, g.mask) for g, (_, ent) in pairs),
            "rollout/response_len": torch.cat([g.mask.sum(1) for g in groups]).mean().item(),
        }
        stats = [grpo.train_rollout_stats(lp, g.rollout_logprobs, g.mask) for g, (lp, _) in pairs]
        step = {k: (max if k.endswith("_max") else _mean)([s[k] for s in stats]) for k in stats[0]}
        step[grpo.SLOPE] = grpo.batch_slope(groups, old_lp)
        if i < cfg.num_rollout - 1:
            advantages = list(grpo.group_advantages(torch.stack([g.rewards for g in groups])))  # G of (n,)
            step.update(clock("train_step", workers.step, groups, old_lp, advantages))
            if i == cfg.num_rollout - 2:  # the last step: its moments are dead weight from here on
                workers.drop_optimizer_state()
            step.update(clock("sync", workers.sync, skip=cfg.inject.skips_sync))
        for kind, metrics in (("rollout", rollout), ("step", step)):
            lines.append({"kind": kind, "index": i, "metrics": metrics})
            log(f"{kind} {i}: {metrics!r}")
    return lines


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values)


def execute(cfg: RunConfig, out: Path, *, repeat: int = 1, process_s: dict | None = None) -> dict:
    """Run `repeat` seeds from the same initial weights and write the records; nothing is gated here."""
    return _execute(cfg, [(cfg, Path(out))], repeat=repeat, process_s=process_s)[0]


def execute_variants(runs: list[tuple[RunConfig, Path]], *, process_s: dict | None = None) -> list[dict]:
    """`rlsmoke run --variants`: one load, then each run from the restored initial weights."""
    return _execute(runs[0][0].replace(inject=Inject()), [(c, Path(out)) for c, out in runs], repeat=1, variants=True,
                    process_s=process_s)  # fmt: skip


def _execute(cfg: RunConfig, runs: list[tuple[RunConfig, Path]], *, repeat: int, variants: bool = False,
             process_s: dict | None = None) -> list[dict]:  # fmt: skip
    """`cfg`: what the workers load (each run's own but for the fault a variant sets on them)."""
    for run_cfg, out in runs:
        run_cfg.validate()
        out.mkdir(parents=True, exist_ok=True)
    # Miles-style `rollout N: {...}` / `step N: {...}` lines, in a new run.log: `load_record` reads them too
    logs = [RunLog(out / "run.log", time.perf_counter()) for _, out in runs]
    for run_log in logs:
        run_log.path.write_text("")
    t0 = time.perf_counter()
    transformers.logging.set_verbosity_error()  # the KDA fallback warnings would bury the table
    mem_estimate = estimate(cfg.spec, plan_of_run(cfg))
    fill_before = det.fill_uninitialized_memory  # a further seed turns it off (engine.reuse.first_seed_only)
    done: list[tuple[list, dict, list, set]] = []  # each run's metrics lines, timing, memory peaks, decodes

    def unfinished(text: str) -> None:  # each open run's log: the load's lines, or what cut the command short
        for run_log in logs[len(done) :] or logs:
            run_log(text)

    log = unfinished  # the load's lines; then each run's own, while it runs

    try:
        ckpt = checkpoint_dir(cfg.case, tiny=cfg.tiny, given=cfg.checkpoint)
        for run_log, (run_cfg, _) in zip(logs, runs, strict=True):
            run_log(f"config: {run_cfg!r}")
        log(f"checkpoint: {ckpt}")
        tokenizer = load_tokenizer(ckpt)
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        # Every seed's prompts first (the sequence limits were checked on the whole file: limits.run.context).
        seeds = [cfg.seed + r for r in range(repeat)]
        prompts_of = {seed: [encode(tokenizer, p) for p in read_prompts(cfg.prompt_data, cfg.n_prompts, seed)]
                      for seed in seeds}  # fmt: skip
        load = {"checkpoint_s": time.perf_counter() - t0}
        workers = open_workers(cfg, ckpt, eos, pad)
        try:
            where, parallel = workers.where, workers.parallel()
            log(f"placement: {cfg.mode} {where}; parallel {parallel}")
            # fla's first-use Triton compile (engine.kda.warm_up) is its own phase, not the load's
            load["compile_s"] = getattr(workers, "compile_s", 0.0)
            load_phases = dict(getattr(workers, "load_phases", None) or {})
            if repeat > 1 or len(runs) > 1:
                kept_from = time.perf_counter()
                workers.keep_initial()  # each further seed or run restores these weights in place (engine.reuse)
                # inside load_s: what a --repeat or --variants pays once for its restores
                load_phases["keep initial"] = time.perf_counter() - kept_from
                where_kept = "on the device" if cfg.initial_on_device else "in host memory"
                log(f"initial weights: kept {where_kept} in {load_phases['keep initial']:.2f} s")
            load["load_s"] = time.perf_counter() - t0 - load["checkpoint_s"] - load["compile_s"]
            if load_phases:
                load["load_phases_s"] = load_phases
            names = [Variant(c.inject, c.rollout_temperature).slug for c, _ in runs]  # each run's folder
            for v, (run_cfg, _) in enumerate(runs):
                log = logs[v]
                # the workers a further run reuses were loaded once, in the first run's seconds
                timing: dict = {"per_seed_s": [], "restore_s": [], "seed_phases_s": []}
                timing |= load if v == 0 else {"checkpoint_s": 0.0, "compile_s": 0.0, "load_s": 0.0}
                if process_s is not None:  # one process: every run of it shares its start
                    timing["process_s"] = dict(process_s)
                if variants:
                    timing["shared_load"] = {"runs": names, "counted_in": names[0]}
                lines: list = []
                decodes: set = set()
                moved_before: dict[str, float] = {}
                for r, seed in enumerate(seeds):
                    seed_start = time.perf_counter()
                    if r or v:
                        workers.restore_initial()
                        timing["restore_s"].append(time.perf_counter() - seed_start)
                        moved_before = workers.move_seconds()  # the restore's own moves count in restore_s
                    if variants:
                        workers.set_variant(run_cfg.inject, run_cfg.rollout_temperature)
                    workers.manual_seed(seed)  # in every process that draws (train-dropout's masks)
                    clock = PhaseClock()
                    run_lines = one_run(
                        run_cfg, workers, prompts_of[seed], tokenizer, seed, log, clock, decodes
                    )
                    timing["per_seed_s"].append(time.perf_counter() - seed_start)
                    moved = workers.move_seconds()  # cumulative: this seed's are the difference
                    own = {phase: s - moved_before.get(phase, 0.0) for phase, s in moved.items()}
                    timing["seed_phases_s"].append(phase_seconds(clock.seconds, own))
                    moved_before = moved
                    timing["phases_s"] = timing["seed_phases_s"][0]  # the first seed pays first-use costs
                    log(f"timing: {describe_timing(timing)}")
                    for line in run_lines if repeat > 1 else ():
                        line["repeat"] = r
                    lines += run_lines
                peaks = workers.memory()  # this run's own: each report opens a new window (engine.offload)
                log(f"memory: estimate {mem_estimate.gib()} GiB per GPU; measured per rank {peaks}")
                done.append((lines, timing, peaks, decodes))
        finally:
            workers.close()
            del workers
            det.fill_uninitialized_memory = fill_before  # as the caller's process had it
            if torch.cuda.is_available():  # the device's memory back for the process's next run
                gc.collect()
                torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        oom = RlsmokeError(
            f"case={cfg.case} ran out of device memory on {cfg.device_class}; the estimate was "
            f"{mem_estimate.describe()}, which the memory check let through",
            rule="engine.oom",
            fix="run with more GPUs (--num-gpus) or --offload, or use --tiny; report the estimate's miss",
        )
        unfinished(f"error: {oom.one_line()}")
        raise oom from None
    except RlsmokeError as exc:  # the cause stays with the artifacts, not only on the terminal
        unfinished(f"error: {exc.one_line()}")
        raise
    except RunError as exc:
        unfinished(f"error: [{exc.rule}] {exc}")
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (Interrupted): the workers were closed above
        unfinished(f"interrupted by {signals.interrupted_by(exc)}; workers stopped")
        raise
    summaries = []
    for (run_cfg, out), (lines, timing, peaks, decodes) in zip(runs, done, strict=True):
        # a variant's own seconds, the first one's with the load
        own = sum(timing[k] for k in ("checkpoint_s", "compile_s", "load_s")) + sum(timing["per_seed_s"])
        seconds = own if variants else time.perf_counter() - t0
        summaries.append(_write_records(run_cfg, out, lines, timing, peaks, mem_estimate, where, parallel, repeat,
                                        seconds, decodes))  # fmt: skip
    return summaries


def _write_records(cfg: RunConfig, out: Path, lines: list, timing: dict, peaks: list, mem_estimate, where: dict,
                   parallel: dict, repeat: int, seconds: float, decodes: set) -> dict:  # fmt: skip
    """metrics.jsonl and summary.json of one run, each written whole or not at all."""
    write_atomic(out / "metrics.jsonl", "".join(json.dumps(line) + "\n" for line in lines))

    memory = {"estimate_gib_per_gpu": mem_estimate.gib(), "params": mem_estimate.params,
              "offload": cfg.offload_active, "offload_train": cfg.offload_train_active, "world": cfg.num_gpus,
              "initial_on_device": cfg.initial_on_device,  # --repeat, --variants: where the initial weights wait
              "peak_gib_per_rank": [max(p.values()) if p else None for p in peaks] or None,
              "peak_gib_per_rank_by_phase": peaks or None,
              # the moves that bring a phase's own state back count in that phase
              "meter": "arrivals-in-own-phase"}  # fmt: skip
    kda_path = kda.choose(cfg.device, cfg.spec.family)
    summary = {
        **cfg.run_key.to_json(),
        "mode": cfg.mode,
        "trainer": cfg.trainer,
        "shape": {
            "n_prompts": cfg.n_prompts,
            "n_samples": cfg.n_samples,
            "max_response_len": cfg.max_response_len,
            "num_rollout": cfg.num_rollout,
            "rollout_batch": batch_for(cfg.rollout_batch, cfg.device, cfg.spec.family, kda_path),
        },  # fmt: skip
        "rollout_decode": decode.record(cfg.rollout_decode, decodes),
        "kda": kda_path or None,  # GLM-5.3-Flash's linear attention: "fla" or "reference"
        "fla_configs": dict(kda.CONFIGS) or None,
        "dtype": {"rollout": cfg.rollout_dtype, "train": cfg.train_dtype, "compute": cfg.train_compute_dtype},
        "seed": cfg.seed,
        "repeat": repeat,
        "inject": str(cfg.inject),
        "rollout_temperature": cfg.rollout_temperature,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": pyplatform.python_version(),
        },  # fmt: skip
        "placement": where,
        "parallel": parallel,  # the training layout as executed
        "memory": memory,
        "artifacts": str(out),
        "seconds": round(seconds, 2),
        "timing": _rounded(timing),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _rounded(x):
    if isinstance(x, float):
        return round(x, 3)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return [_rounded(v) for v in x] if isinstance(x, list) else x
