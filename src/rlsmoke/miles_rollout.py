"""The built-in engine's rollout as Miles' debug-rollout file: the step that stands where SGLang stands.

`python -m rlsmoke.miles_rollout CASE --checkpoint HF --out FILE ...` loads the HF checkpoint
(transformers, the rollout dtype), samples each prompt's group with the engine's `RolloutEngine` (the
same sampler and log-prob recorder as `rlsmoke run`'s rollout 0), scores every sample with the dense
target reward and writes the file (`launch.rollout_file`). Its own process, so the rollout's device
memory is free before Miles starts on the same GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.launch.rollout_file import RolloutSample, check_template, path_for, write

# The faults that live in the file, so Miles trains on them: the others belong to a trainer of rlsmoke's.
FILE_FAULTS = ("temperature-mismatch", "rollout-noise")


def roll_out(case: str, checkpoint: Path, *, tiny: bool, n_prompts: int, n_samples: int, max_response_len: int,
             temperature: float, seeds: list[int], dtype: str, device: str, prompt_data: Path,
             inject: str | None = None) -> list[list[RolloutSample]]:  # fmt: skip
    """One rollout per seed, from one load of the checkpoint: each seed draws its own prompts and samples."""
    import torch

    from rlsmoke.engine.config import parse_inject
    from rlsmoke.engine.data import encode, read_prompts
    from rlsmoke.engine.model import load_policy, load_tokenizer, process_settings
    from rlsmoke.engine.rollout import RolloutEngine, batch_for
    from rlsmoke.models import model_spec

    spec = model_spec(case, tiny=tiny)
    process_settings(None)
    tokenizer = load_tokenizer(checkpoint)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    model = load_policy(checkpoint, spec, dtype, device)
    engine = RolloutEngine(model, temperature=temperature, max_new_tokens=max_response_len, eos_id=eos, pad_id=pad,
                           inject=parse_inject(inject), batch=batch_for("auto", device, spec.family))  # fmt: skip
    rollouts = []
    for seed in seeds:
        prompts = [encode(tokenizer, p) for p in read_prompts(prompt_data, n_prompts, seed)]
        torch.manual_seed(seed)
        # the seed of `rlsmoke run`'s rollout 0
        groups = engine.generate([p.ids for p in prompts], n_samples, seed=seed * 100)
        rollouts.append(samples_of(groups, prompts, tokenizer, eos))
    return rollouts


def samples_of(groups, prompts, tokenizer, eos: int) -> list[RolloutSample]:
    from rlsmoke.engine.reward import REWARDS

    samples: list[RolloutSample] = []
    for g, p in zip(groups, prompts, strict=True):
        for row in range(g.tokens.shape[0]):
            length = int(g.mask[row].sum().item())  # up to and including the first EOS
            response = [int(t) for t in g.response[row, :length]]
            text = tokenizer.decode(response)
            samples.append(RolloutSample(
                group_index=g.prompt_index, index=len(samples), prompt=p.text, label=p.label,
                prompt_tokens=p.ids, response_tokens=tuple(response), response_text=text,
                reward=REWARDS["target"](text, response, p.label),
                rollout_log_probs=tuple(float(x) for x in g.rollout_logprobs[row, :length]),
                truncated=response[-1] != eos,
            ))  # fmt: skip
    return samples


def check_inject(inject: str | None) -> None:
    """Only a fault that lives in the rollout file reaches Miles' trainer."""
    from rlsmoke.engine.config import parse_inject

    if (kind := parse_inject(inject).kind) and kind not in FILE_FAULTS:
        raise RlsmokeError(f"inject={inject} is a fault of rlsmoke's own trainer; Miles trains on the rollout file",
                           rule="miles.inject", fix=f"use one of: {', '.join(FILE_FAULTS)}")  # fmt: skip


def summary_of(samples: list[RolloutSample]) -> dict:
    """What the file holds, in numbers: Miles' own rollout line logs the same means."""
    tokens = [len(s.response_tokens) for s in samples]
    return {"samples": len(samples), "groups": len({s.group_index for s in samples}),
            "raw_reward": sum(s.reward for s in samples) / len(samples),
            "rollout_log_probs": sum(sum(s.rollout_log_probs) / len(s.rollout_log_probs) for s in samples) / len(samples),
            "response_len": sum(tokens) / len(tokens), "truncated": sum(s.truncated for s in samples)}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rlsmoke.miles_rollout",
                                description="one rollout of the built-in engine, written as Miles' debug-rollout "
                                "file (--load-debug-rollout-data)")  # fmt: skip
    p.add_argument("case")
    p.add_argument("--checkpoint", type=Path, required=True, help="the HF checkpoint folder")
    p.add_argument("--out", required=True, help="the file template; Miles fills in {rollout_id}")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--n-prompts", type=int, required=True, help="Miles' --rollout-batch-size")
    p.add_argument("--n-samples", type=int, required=True, help="Miles' --n-samples-per-prompt")
    p.add_argument("--max-response-len", type=int, required=True, help="Miles' --rollout-max-response-len")
    p.add_argument(
        "--temperature",
        type=float,
        required=True,
        help="Miles' --rollout-temperature: sampling and the log-probs' temperature",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat", type=int, default=1, help="K files, rollout ids 0..K-1 from seeds SEED..SEED+K-1"
    )
    p.add_argument("--dtype", help="float32 | bfloat16 (default bfloat16 on a GPU, float32 on CPU)")
    p.add_argument("--device", help="default cuda when there is one, else cpu")
    p.add_argument("--prompt-data", type=Path, required=True)
    p.add_argument("--inject",
                   help="a fault in the file: temperature-mismatch (log-probs of the raw logits, T=1), "
                   "rollout-noise=SIGMA")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_template(args.out)
        check_inject(args.inject)
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        seeds = [args.seed + i for i in range(args.repeat)]
        rollouts = roll_out(args.case, args.checkpoint, tiny=args.tiny, n_prompts=args.n_prompts,
                            n_samples=args.n_samples, max_response_len=args.max_response_len,
                            temperature=args.temperature, seeds=seeds, dtype=dtype, device=device,
                            prompt_data=args.prompt_data, inject=args.inject)  # fmt: skip
    except RlsmokeError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return ExitCode.USAGE
    for rollout_id, (seed, samples) in enumerate(zip(seeds, rollouts, strict=True)):
        path = write(path_for(args.out, rollout_id), samples, rollout_id=rollout_id)
        info = summary_of(samples) | {"device": device, "dtype": dtype, "temperature": args.temperature,
                                      "inject": args.inject, "seed": seed, "file": str(path)}  # fmt: skip
        print(f"rollout file: {json.dumps(info)}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
