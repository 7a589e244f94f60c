"""GLM-5 config.json dialects: the older Miles' (`deepseek_v32`: DeepSeek-V3.2 labels, an auto_map, a flat
`rope_theta`) and the newer, native one (`glm_moe_dsa`), which refuses those. Tensors are the same."""

from __future__ import annotations

import json
from pathlib import Path

from rlsmoke.artifacts import write_atomic
from rlsmoke.errors import CheckpointError, require_known

NATIVE = "glm_moe_dsa"
OLD_MILES = "deepseek_v32"
DIALECTS = (NATIVE, OLD_MILES)
NATIVE_ARCH = "GlmMoeDsaForCausalLM"
OLD_ARCH = "DeepseekV32ForCausalLM"
OLD_AUTO_MAP = {
    "AutoConfig": "configuration_deepseek_v32.DeepseekV32Config",
    "AutoModelForCausalLM": "modeling_deepseek_v32.DeepseekV32ForCausalLM",
}


def check_dialect_name(dialect: str, model_type: str | None = None) -> None:
    require_known("dialect", dialect, DIALECTS, rule="checkpoint.dialect")
    if model_type is not None and model_type not in DIALECTS:
        raise CheckpointError(
            f"dialect={dialect!r} applies to GLM-5 (glm_moe_dsa) checkpoints, not model_type={model_type!r}",
            rule="checkpoint.dialect",
            fix="drop --dialect for this case",
        )


def dialect_problems(cfg: dict, dialect: str) -> list[str]:
    """What a Miles of `dialect` would reject in this config.json (empty: it is accepted)."""
    check_dialect_name(dialect, cfg.get("model_type"))
    model_type, arch, says = {NATIVE: (NATIVE, NATIVE_ARCH, "the newer Miles requires"),
                              OLD_MILES: (OLD_MILES, OLD_ARCH, "the older Miles expects")}[dialect]  # fmt: skip
    problems = []
    if cfg.get("model_type") != model_type:
        problems.append(f"model_type={cfg.get('model_type')!r}, {says} {model_type!r}")
    if cfg.get("architectures") != [arch]:
        problems.append(f"architectures={cfg.get('architectures')!r}, {says} [{arch!r}]")
    if dialect == NATIVE and "auto_map" in cfg:
        problems.append("has an auto_map, which the newer Miles refuses")
    if dialect == OLD_MILES and cfg.get("auto_map") != OLD_AUTO_MAP:
        problems.append("has no DeepseekV32 auto_map, which the older Miles loads through")
    if dialect == OLD_MILES and "rope_theta" not in cfg:
        problems.append("has no top-level rope_theta, which older mbridge reads")
    return problems


def patched(cfg: dict, dialect: str) -> dict:
    """config.json rewritten for a checked `dialect`; applying it twice changes nothing."""
    out = dict(cfg)
    if dialect == NATIVE:
        out.update(model_type=NATIVE, architectures=[NATIVE_ARCH])
        out.pop("auto_map", None)
        if "rope_theta" in out and "rope_parameters" in out:
            out.pop("rope_theta")  # transformers v5 keeps it nested only
    else:
        out.update(model_type=OLD_MILES, architectures=[OLD_ARCH], auto_map=dict(OLD_AUTO_MAP))
        if (theta := (out.get("rope_parameters") or {}).get("rope_theta", out.get("rope_theta"))) is None:
            raise CheckpointError(
                "config.json: has no rope_parameters.rope_theta to flatten",
                rule="checkpoint.dialect",
                fix="add rope_parameters.rope_theta",
            )
        out["rope_theta"] = theta
    return out


def patch(folder: Path | str, dialect: str) -> list[str]:
    """Rewrite folder/config.json for `dialect` (atomically) where its Miles would refuse it; returns why."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"{path}: cannot read ({e})", rule="checkpoint.config", fix="restore config.json"
        ) from e
    if problems := dialect_problems(cfg, dialect):
        write_atomic(path, json.dumps(patched(cfg, dialect), indent=2, sort_keys=True) + "\n")
    return problems
