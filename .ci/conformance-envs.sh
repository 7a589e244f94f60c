#!/usr/bin/env bash
# Build the conformance venvs from scratch: the real Miles, SGLang 0.5.23 and megatron-core parsers.
#
#   bash .ci/conformance-envs.sh [--fresh]      (CI: .ci/run calls it before .ci/conformance.sh)
#
# Three venvs, because miles-rl and sglang both install a top-level `sglang` and miles-rl vendors a
# `megatron` package that megatron-core 0.16.1 would overwrite:
#   $RLSMOKE_CONFORMANCE_VENVS/cvenv-miles   miles-rl 0.0.2 (Megatron-LM + bundled SGLang), transformers 5.24.0
#   $RLSMOKE_CONFORMANCE_VENVS/cvenv-sglang  sglang 0.5.23, transformers 5.19.0, real triton 3.9.0
#   $RLSMOKE_CONFORMANCE_VENVS/cvenv-mcore   megatron-core 0.16.1
# (default folder: ~/.cache/rlsmoke/conformance). torch is 2.13.0, the CPU build;
# everything else is installed `--no-deps` from the full pin lists below, so nothing can pull a
# CUDA torch or drift. A venv whose pins did not change since its last build is kept (a stamp file
# holds their hash); --fresh rebuilds all three. Each venv gets rlsmoke itself `--no-deps -e`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${RLSMOKE_CONFORMANCE_VENVS:-$HOME/.cache/rlsmoke/conformance}"
PYTHON="${RLSMOKE_CONFORMANCE_BASE_PYTHON:-python3.11}"
TORCH="torch==2.13.0"
FRESH=0
[[ "${1:-}" == "--fresh" ]] && FRESH=1

# Everything each venv holds besides torch, as `pip freeze` printed it after the install lines of
# shared/reference/real-parsers.md (2026-11-29).
MILES_PINS="
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 asttokens==3.0.2 attrs==26.1.0 certifi==2026.10.19.post1
charset-normalizer==3.5.3 click==8.5.1 compressed-tensors==0.20.1 dill==0.4.1 executing==2.3.0
fastapi==0.165.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0 h11==0.16.0
hf-xet==1.8.0 httpcore2==2.16.2 httpcore==1.0.9 httpx2==2.16.2 httpx==0.28.1 huggingface_hub==2.4.0
idna==3.20 iniconfig==2.3.1 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1
Jinja2==3.1.6 jiter==0.19.0 jsonschema-specifications==2025.9.1 jsonschema==4.26.0 loguru==0.7.3
markdown-it-py==4.3.0 MarkupSafe==3.0.4 matplotlib-inline==0.2.2 mdurl==0.1.2 miles-rl==0.0.2
mpmath==1.3.0 msgpack==1.2.4 multidict==7.2.1 networkx==3.6.1 numpy==2.4.6 openai==3.57.0
opentelemetry-api==1.45.2 orjson==3.13.0 packaging==26.4 parso==0.8.7
partial-json-parser==0.2.1.1.post7 pexpect==4.9.0 pillow==13.0.0 pluggy==1.7.0
prompt_toolkit==3.0.53 propcache==0.5.4 protobuf==7.36.2 psutil==7.2.2 ptyprocess==0.7.0
pure_eval==0.2.4 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0
pytest==9.2.0 PyYAML==6.0.4 pyzmq==27.3.0 ray==2.60.0 referencing==0.37.0 regex==2026.11.19
requests==2.34.2 rich==15.0.0 rpds-py==2026.9.1 safetensors==0.8.0 sentencepiece==0.2.3
setproctitle==1.3.8 sglang-router==0.3.2 shellingham==1.5.4 six==1.17.0 sniffio==1.3.1
stack-data==0.6.3 starlette==1.10.0 sympy==1.14.0 tokenizers==0.23.3 tqdm==4.70.1 traitlets==5.16.1
transformers==5.24.0 truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5
typing_extensions==4.16.0 urllib3==2.8.0 uvicorn==0.54.0 wcwidth==0.9.4 yarl==1.25.1"
SGLANG_PINS="
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11 asttokens==3.0.2 attrs==26.1.0
certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 compressed-tensors==0.18.0
dill==0.4.1 distro==1.9.0 executing==2.3.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0
gguf==0.19.0 h11==0.16.0 hf-xet==1.8.0 httpcore==1.0.9 httpx==0.28.1 huggingface_hub==1.33.0
idna==3.20 iniconfig==2.3.1 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1
Jinja2==3.1.6 jiter==0.19.0 loguru==0.7.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4
matplotlib-inline==0.2.2 mdurl==0.1.2 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1
networkx==3.6.1 numpy==2.4.6 openai==2.8.0 orjson==3.13.0 packaging==26.4 parso==0.8.7
pexpect==4.9.0 pillow==13.0.0 pluggy==1.7.0 prompt_toolkit==3.0.53 propcache==0.5.4 psutil==7.2.2
ptyprocess==0.7.0 pure_eval==0.2.4 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5
Pygments==2.21.0 pytest==9.2.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2
rich==15.0.0 safetensors==0.8.0 sentencepiece==0.2.1 sglang==0.5.23 shellingham==1.5.4
sniffio==1.3.1 stack-data==0.6.3 starlette==1.10.0 sympy==1.14.0 tokenizers==0.23.2 tqdm==4.70.1
traitlets==5.16.1 transformers==5.19.0 triton==3.9.0 typer==0.29.2 typing-inspection==0.4.5
typing_extensions==4.16.0 urllib3==2.8.0 wcwidth==0.9.4 yarl==1.25.1"
MCORE_PINS="
filelock==4.3.1 fsspec==2026.9.0 iniconfig==2.3.1 Jinja2==3.1.6 MarkupSafe==3.0.4
megatron-core==0.16.1 mpmath==1.3.0 networkx==3.6.1 numpy==2.4.6 packaging==26.4 pluggy==1.7.0
Pygments==2.21.0 pytest==9.2.0 sympy==1.14.0 typing_extensions==4.16.0"

build() {  # name pins version-check
  local name="$1" pins="$2" check="$3"
  local venv="$VENVS/cvenv-$name" work stamp start
  stamp="$(printf '%s\n%s\n%s\n' "$PYTHON" "$TORCH" "$pins" | sha256sum | cut -c1-16)"
  if [[ $FRESH == 0 && -f "$venv/.rlsmoke-stamp" && "$(cat "$venv/.rlsmoke-stamp")" == "$stamp" ]]; then
    "$venv/bin/pip" install -q --no-deps -e "$REPO" >/dev/null
    echo "cvenv-$name: up to date ($venv)"
    return
  fi
  start=$SECONDS
  work="$(mktemp -d)"
  echo "$TORCH" > "$work/constraints.txt"
  echo "$pins" | tr ' ' '\n' | grep -v '^$' > "$work/pins.txt"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q -c "$work/constraints.txt" "$TORCH"
  "$venv/bin/pip" install -q --no-deps -c "$work/constraints.txt" -r "$work/pins.txt"
  "$venv/bin/pip" install -q --no-deps -e "$REPO"
  # The harness's own loader: the real parser imports under the import-only stubs.
  (cd "$work" && "$venv/bin/python" -W ignore -c "from rlsmoke.conformance.worker import load; load('$name'); $check")
  echo "$stamp" > "$venv/.rlsmoke-stamp"
  rm -rf "$work"
  echo "cvenv-$name: built in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1), $venv)"
}

build miles "$MILES_PINS" "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
build sglang "$SGLANG_PINS" "import sglang.version as v; assert v.__version__ == '0.5.23', v.__version__"
build mcore "$MCORE_PINS" "import megatron.core as m; assert m.__version__ == '0.16.1', m.__version__"
