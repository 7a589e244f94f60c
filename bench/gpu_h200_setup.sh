# Source on a GPU host without a package index: the wheels in .whl/ (flash-linear-attention, fla-core; for the
# megatron trainer megatron-core's cp312 wheel, of a version the `megatron` extra in pyproject.toml takes:
# `pip download megatron-core==VERSION --python-version 3.12 --only-binary :all: --no-deps -d .whl`)
# into /tmp/site, rlsmoke from this checkout, the caches on local disk.
#   . bench/gpu_h200_setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1 || true
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
export RLSMOKE_CACHE=${RLSMOKE_CACHE:-/root/rlsmoke-cache}
rlsmoke() { python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' "$@"; }
# the checkpoints of `NUM_GPUS=1 pytest -m nvidia tests/e2e`, in the order its tests run
SUITE_CASES=$(python3 bench/suite_cases.py)
