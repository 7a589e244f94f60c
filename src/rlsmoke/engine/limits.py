"""The range of every input of `rlsmoke run`, checked before torch loads, so a bad value is refused with
its flag and fix instead of crashing a worker, hanging a loop or exhausting the host. No torch here."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from rlsmoke.errors import CheckpointError, RlsmokeError
from rlsmoke.memory import GIB, estimate, plan_of_run
from rlsmoke.shipped import FIXTURES

# torch.Generator.manual_seed takes an unsigned 64-bit seed.
SEED_MAX = 2**64 - 1
# The largest derived rollout seed ((seed * 100 + rollout) * 1000 + prompt + NOISE_OFFSET) must fit 64 bits.
ROLLOUTS_PER_SEED, PROMPTS_PER_ROLLOUT, NOISE_OFFSET = 100, 1000, 7
MAX_REPEAT = 1000  # seeds of one run (calibration takes 10)
MAX_TEMPERATURE = 100.0  # past it the sampler is uniform over the vocabulary: nothing left to gate
MAX_NOISE_SIGMA = 100.0  # the rollout-noise fault's log-prob noise, in nats
# Of the host's (or cgroup's) memory, what one run may plan to hold; the OS and page cache need the rest.
HOST_FRACTION = 0.8
PROCESS_BYTES = 2**29


def _finite(flag: str, value: float) -> None:
    if not math.isfinite(value):
        raise RlsmokeError(f"{flag}={value} is not a finite number", rule="run.finite",
                           fix=f"give {flag} a finite number")  # fmt: skip


def check_numbers(cfg, *, repeat: int) -> None:
    """Every numeric flag finite and within what the engine takes; the seeds within 64 bits."""
    _finite("--rollout-temperature", cfg.rollout_temperature)
    if not 0 < cfg.rollout_temperature <= MAX_TEMPERATURE:
        raise RlsmokeError(f"--rollout-temperature={cfg.rollout_temperature} is outside (0, {MAX_TEMPERATURE:g}]",
                           rule="run.range", fix="sample at a temperature in (0, 100]; seed 000 uses 0.8")  # fmt: skip
    kind, value = cfg.inject.kind, cfg.inject.value
    if kind:
        _finite(f"--inject {kind}", value)
    if kind == "train-dropout" and not 0 < value < 1:
        raise RlsmokeError(f"--inject train-dropout={value:g} is not a probability in (0, 1): at 1 every activation "
                           "is dropped and the rest are scaled by 1/(1-P)", rule="inject.value",
                           fix="write --inject train-dropout=P with 0 < P < 1, e.g. 0.1")  # fmt: skip
    if kind == "rollout-noise" and not 0 < value <= MAX_NOISE_SIGMA:
        raise RlsmokeError(f"--inject rollout-noise={value:g} is outside (0, {MAX_NOISE_SIGMA:g}]", rule="inject.value",
                           fix="write --inject rollout-noise=SIGMA with a small SIGMA, e.g. 0.01")  # fmt: skip
    # past its slot in the derived seeds two samplers of one run would draw the same numbers
    for flag, value, top in (("--num-rollout", cfg.num_rollout, ROLLOUTS_PER_SEED),
                             ("--n-prompts", cfg.n_prompts, PROMPTS_PER_ROLLOUT), ("--repeat", repeat, MAX_REPEAT)):  # fmt: skip
        if value > top:
            raise RlsmokeError(
                f"{flag}={value} is past {top}", rule="run.range", fix=f"pass {flag} of at most {top}"
            )
    # the largest --seed whose derived generator seeds all stay within 64 bits
    rollout_seed_max = (SEED_MAX - NOISE_OFFSET - (cfg.n_prompts - 1)) // PROMPTS_PER_ROLLOUT
    largest = (rollout_seed_max - (cfg.num_rollout - 1)) // ROLLOUTS_PER_SEED - (repeat - 1)
    if not 0 <= cfg.seed <= largest:
        why = ("negative" if cfg.seed < 0 else
               f"past {largest}: the rollout seeds each prompt's sampler with (seed x {ROLLOUTS_PER_SEED} + rollout) "
               f"x {PROMPTS_PER_ROLLOUT} + prompt, which must stay within 2**64-1")  # fmt: skip
        raise RlsmokeError(f"--seed={cfg.seed} is {why}", rule="run.seed",
                           fix=f"pass --seed between 0 and {largest}")  # fmt: skip


# --- sequence lengths --------------------------------------------------------------------------


@dataclass(frozen=True)
class LongestPrompt:
    tokens: int  # through the chat template, as the engine encodes it
    line: int  # 1-based line of the prompt file


def longest_prompt(prompt_data: Path, tokenizer_dir: Path | None = None) -> LongestPrompt:
    """The prompt file's longest prompt in tokens as `engine.data.encode` renders it, without torch."""
    from tokenizers import Tokenizer

    folder = FIXTURES / "tokenizer"
    if tokenizer_dir and (Path(tokenizer_dir) / "tokenizer.json").is_file():
        folder = Path(tokenizer_dir)
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # an unreadable one is the loader's to name: count with the shipped one
        folder = FIXTURES / "tokenizer"
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    render = _template(folder)
    best = LongestPrompt(0, 0)
    for number, line in enumerate(Path(prompt_data).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            n = len(tok.encode(render(json.loads(line)["prompt"]), add_special_tokens=False).ids)
            if n > best.tokens:
                best = LongestPrompt(n, number)
    return best


def _template(folder: Path):
    """The chat template for one user turn plus the assistant header, as transformers renders it."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    try:
        source = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
        template = env.from_string(source) if isinstance(source, str) else None
    except Exception:  # no readable template: the prompt as it is
        template = None

    def render(text: str) -> str:
        if template is None:
            return text
        try:
            return template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        except Exception:  # the engine's own rendering names a broken template
            return text

    return render


def context_limits(spec, checkpoint: Path | None = None) -> dict[str, int]:
    """max_position_embeddings and, with DSA, index_topk: from the checkpoint's config when given."""
    cfg = dict(spec.hf_text_kwargs())
    if checkpoint is not None and (Path(checkpoint) / "config.json").is_file():
        try:
            doc = json.loads((Path(checkpoint) / "config.json").read_text())
        except (OSError, ValueError):
            doc = {}  # checkpoint.verify names it, with the line and column
        if not isinstance(doc, dict) or not isinstance(doc.get("text_config") or {}, dict):
            raise CheckpointError(f"checkpoint={checkpoint}: config.json is not a JSON object of a model's config",
                                  rule="checkpoint.verify",
                                  fix="re-create the checkpoint (rlsmoke prepare ... --force), or pass another")  # fmt: skip
        cfg = doc.get("text_config") or doc
    return {k: int(cfg[k]) for k in ("max_position_embeddings", "index_topk") if isinstance(cfg.get(k), int)}


def check_context(cfg, longest: LongestPrompt, limits: dict[str, int]) -> None:
    total = longest.tokens + cfg.max_response_len
    for name, limit in limits.items():
        if total <= limit:
            continue
        why = {"max_position_embeddings": "the model's context",
               "index_topk": "DSA's index_topk: past it the KV-cache decode and the full forward pick different "
                             "keys, so train and rollout log-probs stop being comparable"}[name]  # fmt: skip
        if longest.tokens >= limit:
            fix = (f"shorten line {longest.line} of {cfg.prompt_data} (or drop it): {longest.tokens} tokens alone "
                   f"reach {name}={limit}")  # fmt: skip
        elif cfg.max_response_len > limit // 2:
            fix = f"lower --max-response-len to at most {limit - longest.tokens}"
        else:
            fix = (f"shorten line {longest.line} of {cfg.prompt_data} to at most {limit - cfg.max_response_len} "
                   f"tokens, or lower --max-response-len to at most {limit - longest.tokens}")  # fmt: skip
        raise RlsmokeError(
            f"the longest sequence is {total} tokens (line {longest.line} of {cfg.prompt_data}: {longest.tokens} "
            f"prompt tokens, + --max-response-len {cfg.max_response_len}), past {name}={limit}, {why}",
            rule="run.context", fix=fix)  # fmt: skip


# --- host memory -------------------------------------------------------------------------------


def host_memory_bytes() -> int:
    """What this process may use of the host: its memory, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        with contextlib.suppress(OSError):
            if (text := limit.read_text().strip()).isdigit():
                total = min(total, int(text))
    return total


def check_host_memory(cfg, prompt_tokens: int) -> None:
    """On CPU, refuse a batch the host cannot hold, by the memory estimate."""
    est = estimate(cfg.spec, replace(plan_of_run(cfg), prompt_len=max(prompt_tokens, 1)))
    processes = cfg.num_gpus if cfg.mode == "colocate" else 2  # async: a trainer and a rollout engine
    # every rollout's groups are kept until it is scored: ids, mask and log-probs per token
    kept = cfg.n_prompts * cfg.n_samples * (prompt_tokens + cfg.max_response_len) * 32
    need = processes * (est.peak + PROCESS_BYTES) + kept
    have = host_memory_bytes()
    if need > HOST_FRACTION * have:
        raise RlsmokeError(
            f"the batch of {cfg.n_prompts} prompts x {cfg.n_samples} samples x ({prompt_tokens} + "
            f"{cfg.max_response_len}) tokens needs about {need / GIB:.1f} GiB of host memory ({processes} process(es) "
            f"of {est.describe().replace(' per GPU', '')}), past {HOST_FRACTION:.0%} of this host's "
            f"{have / GIB:.1f} GiB", rule="memory.host",
            fix="lower --n-samples, --n-prompts or --max-response-len")  # fmt: skip
