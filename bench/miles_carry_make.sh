#!/usr/bin/env bash
# Makes .miles-carry/: Miles' environment for the train-only step on an H200 host that has no package index,
# in pieces small enough to carry one a call (bench/gpu_miles_train_only.sh receives and joins them).
#   bench/miles_carry_make.sh [PIECE_MIB]          (where a package index is reachable; about 10 minutes)
# Needs: git mirrors of radixark/miles and radixark/Megatron-LM in MILES_GIT and MEGATRON_GIT, and in
# TORCH_PYTHON an interpreter with a CUDA build of torch (any version; no GPU needed), or TE_SDIST.
set -euo pipefail
piece=${1:-52}
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MILES_CARRY_WORK:-/tmp/miles-carry-work}
miles_commit=31f1ca961 megatron_commit=2e64d788b   # Miles main and Megatron-LM miles-main, as docs/miles.md
: "${MILES_GIT:?a git dir of radixark/miles}" "${MEGATRON_GIT:?a git dir of radixark/Megatron-LM}"
plat=(--python-version 3.12 --implementation cp --platform any)
for tag in manylinux1 manylinux2010 manylinux2014; do plat+=(--platform "${tag}_x86_64"); done
for n in 17 24 27 28 31 34 35 38 39; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
rm -rf "$work" && mkdir -p "$work"/{wheels,sdist,src/miles,src/Megatron-LM} "$root/.miles-carry"
grep -v '^#' "$root/bench/miles_carry.txt" > "$work/pins.txt"
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$work/wheels" -r "$work/pins.txt"
# TE's torch extension has no binary wheel: its sdist is built on the host, against the host's torch.
# pip reads the sdist's metadata by running its setup.py, which imports a CUDA build of torch.
# TE_SDIST names an sdist already downloaded (no CUDA torch needed then).
if [ -n "${TE_SDIST:-}" ]; then cp "$TE_SDIST" "$work/sdist/"; else
  "${TORCH_PYTHON:-python3}" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$work/sdist" \
    transformer-engine-torch==2.17.0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: "${plat[@]}" --target "$work/site" \
  "$work"/wheels/*.whl
site=$work/site
# What the step never loads: Ray's Java jars, its dashboard's web client and RLlib; xgrammar's static
# library; TE's JAX half; jedi's stubs; sglang-router's Rust extension (its stand-in is installed below).
rm -rf "$site"/ray/{jars,rllib} "$site/ray/dashboard/client/build" "$site/xgrammar/lib/libxgrammar.a" \
  "$site/transformer_engine/jax" "$site/jedi/third_party" "$site"/sglang_router/sglang_router_rs*.so \
  "$site/bin/killall_sglang"
for f in "$site"/bin/*; do head -1 "$f" | grep -q '^#!.*python' && sed -i '1s|^#!.*$|#!/usr/bin/env python3|' "$f"; done
python3 "$root/bench/miles_overlay/install_into_site.py" "$site"
git -C "$MILES_GIT" archive "$miles_commit" | tar -x -C "$work/src/miles" --exclude=docs
git -C "$MEGATRON_GIT" archive "$megatron_commit" | tar -x -C "$work/src/Megatron-LM" --exclude=tests --exclude=docs
cd "$work"
te=(site/transformer_engine site/transformer_engine-2.17.0.dist-info site/transformer_engine_cu13-2.17.0.dist-info)
tar --exclude=__pycache__ "${te[@]/#/--exclude=}" -cf - site src sdist | xz -6 -T0 > misc.tar.xz
tar --exclude=__pycache__ -cf - "${te[@]}" | xz -6 -T0 > te.tar.xz
# cuDNN at Miles' image pin (docker/Dockerfile installs it over torch's own): TE 2.17's fused-attention
# backward sets a reshape mode that an older cuDNN refuses (CUDNN_STATUS_BAD_PARAM). The whole wheel
# travels, in pieces of its own: TE's core links eight of its libraries by name, and any one left out is
# found in the host's older cuDNN instead.
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$work/cudnn" nvidia-cudnn-cu13==9.22.0.52
rm -f "$root"/.miles-carry/cudnn-*
split -b 60M -d -a 2 "$work"/cudnn/nvidia_cudnn_cu13-*.whl "$root/.miles-carry/cudnn-"
cat misc.tar.xz te.tar.xz > all.tar.xz.parts && rm -f "$root"/.miles-carry/piece-*
split -b "${piece}M" -d -a 2 all.tar.xz.parts "$root/.miles-carry/piece-"
printf '%s\n' "misc $(stat -c %s misc.tar.xz)" "te $(stat -c %s te.tar.xz)" > "$root/.miles-carry/sizes"
(cd "$root/.miles-carry" && sha256sum piece-* cudnn-* > SHA256SUMS)
ls -la "$root/.miles-carry"
