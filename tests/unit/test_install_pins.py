"""The CPU install line: torch is held to its CPU build by name, so no pip can pull the CUDA wheels.

A bare `torch==X.Y.Z` resolves to the CUDA build wherever pip's default index serves it (several GB);
`torch==X.Y.Z+cpu` exists only on PyTorch's CPU wheel index, so an install without that index fails
loudly instead. These checks read the files a user and CI install from.
"""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_PIN = re.compile(r"^torch==\d+\.\d+\.\d+\+cpu$")


def _pip_installs(text: str) -> list[list[str]]:
    """The argv of each `pip install` in a shell text (comments and continuation lines folded)."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        for part in re.split(r"&&|;|\|\|", line.split(" #")[0]):
            words = shlex.split(part, comments=True) if part.strip() else []
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append(words[i + 2 :])
    return found


def _torch_requirements(args: list[str]) -> list[str]:
    return [a for a in args if re.match(r"^torch\b", a) and not a.startswith("torchvision")]


def _cpu_installs(text: str) -> list[list[str]]:
    """Installs of the project or of torch: what the CPU line is made of."""
    return [
        a for a in _pip_installs(text) if _torch_requirements(a) or any(x.startswith(("-e", ".[")) for x in a)
    ]


def test_the_pin_file_names_the_cpu_build():
    lines = [x.strip() for x in (ROOT / ".ci/torch-cpu.txt").read_text().splitlines()]
    pins = [x for x in lines if x and not x.startswith("#")]
    assert len(pins) == 1 and CPU_PIN.match(pins[0]), pins


def _held_to_cpu(args: list[str]) -> bool:
    """Every torch requirement is a +cpu pin, and the project install is constrained or joined by the pin file."""
    if any(not CPU_PIN.match(t) for t in _torch_requirements(args)):
        return False
    pinned_files = {args[i + 1] for i in range(len(args) - 1) if args[i] in ("-r", "-c", "--constraint",
                                                                           "--requirement")}  # fmt: skip
    project = any(a.startswith(("-e", ".[")) or a == "." for a in args)
    return not project or ".ci/torch-cpu.txt" in pinned_files or bool(_torch_requirements(args))


def test_ci_installs_only_the_cpu_build():
    installs = _cpu_installs((ROOT / ".ci/run").read_text())
    assert installs, "no pip install found in .ci/run"
    bad = [a for a in installs if not _held_to_cpu(a)]
    assert not bad, f".ci/run installs torch without the +cpu pin: {bad}"


def test_ci_takes_the_index_from_the_environment():
    text = (ROOT / ".ci/run").read_text()
    assert "RLSMOKE_TORCH_INDEX" in text and "--extra-index-url" in text


def test_readme_cpu_line_holds_torch_to_the_cpu_build():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(re.findall(r"```bash\n(.*?)```", quick, re.S))
    installs = _cpu_installs(code)
    cpu = [
        a
        for a in installs
        if ".ci/torch-cpu.txt" in a or any(CPU_PIN.match(t) for t in _torch_requirements(a))
    ]
    assert cpu, f"the README has no CPU install line: {installs}"
    assert all(_held_to_cpu(a) for a in cpu), cpu
    assert "CPU wheel index" in quick  # where pip finds the +cpu build, said in words
    assert 'pip install -e ".[dev]"' in code  # the GPU line, on its own


def test_tox_holds_every_cpu_env_to_the_pin():
    tox = (ROOT / "tox.ini").read_text()
    assert "PIP_CONSTRAINT = {tox_root}/.ci/torch-cpu.txt" in tox


def test_no_package_index_address_is_written_down():
    for name in (".ci/run", ".ci/torch-cpu.txt", "README.md", "tox.ini"):
        text = (ROOT / name).read_text()
        assert not re.search(r"https?://\S*(whl|simple|pypi|index)", text), name
