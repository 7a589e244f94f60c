#!/usr/bin/env bash
# Miles main's trainer for one step on an H200 host with no package index, from .miles-carry/
# (bench/miles_carry_make.sh makes it; its pieces travel one a call, and a warm host keeps them):
#   bench/gpu_miles_train_only.sh receive OUT        move .miles-carry's pieces to $MILES_ENV/carry
#   bench/gpu_miles_train_only.sh misc OUT           once the first pieces are there: unpack all but TE's
#                                                    core, then start `build` in its own session and return
#   bench/gpu_miles_train_only.sh build OUT          (from misc) TE's torch extension built against the host's
#                                                    torch, Ray probed, the HF checkpoint prepared
#   bench/gpu_miles_train_only.sh te OUT             once every piece is there: TE's core; wait for the build;
#                                                    probe TE; Miles' converter (bench/miles_convert.py)
#   bench/gpu_miles_train_only.sh cudnn OUT          once .miles-carry/cudnn-* are there: cuDNN at Miles' image
#                                                    pin beside the host's; TE's THD attention probed on both
#   bench/gpu_miles_train_only.sh suite OUT [ARGS]   the Miles e2e module under pytest (junit in OUT)
#   bench/gpu_miles_train_only.sh seeds OUT          ten seeds in one launch, a key calibrated from them, and
#                                                    each step's time (the first pays the kernels' compiles)
# LEAN=1 leaves out the probes that only explain a failure (TE's Linear, the attention on the host's cuDNN).
# Nothing of the host is upgraded: Miles' packages go --no-deps into $MILES_ENV/site, ahead on PYTHONPATH.
set -uo pipefail
stage=${1:?receive, misc, build, te, cudnn, suite or seeds}; out=${2:-/tmp/miles-out}
case $stage in receive|misc|build|te|cudnn|suite|seeds) ;; *) echo "error: [bench.stage] $stage is not a stage (usage above)"; exit 2 ;; esac
env_dir=${MILES_ENV:-/root/miles-env}; site=$env_dir/site
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$env_dir/carry" "$out"
steps_out=$out budget=${BUDGET_S:-3000} start=$(date +%s)
. "$here/bench/steps.sh"
export PYTHONPATH=$here/bench/miles_overlay:$site:$here/src PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
export NVTE_FRAMEWORK=pytorch RLSMOKE_STANDIN_LOG=$out/standin.log RLSMOKE_CACHE=${RLSMOKE_CACHE:-/root/rlsmoke-cache}
export RLSMOKE_MILES_ROOT=$env_dir/src/miles RLSMOKE_MEGATRON_ROOT=$env_dir/src/Megatron-LM
export RLSMOKE_MILES_MODELS=$env_dir/models
# cuDNN 9.22.0.52, Miles' image pin, once the cudnn stage has put it there. Every one of its libraries is
# preloaded: TE's core links eight of them by name and has no RUNPATH, so one left out would come from the
# host's older cuDNN (seen on the H200 with libcudnn.so.9 alone preloaded: torch read cuDNN 9.14, and
# TE's backward failed as with none). TE looks in CUDNN_HOME first.
cudnn=$env_dir/nvidia/cudnn
find_cudnn() {
  cudnn_libs=$(ls "$cudnn"/lib/libcudnn*.so.9 2>/dev/null | paste -sd:)
  with_cudnn=(env LD_PRELOAD=$cudnn_libs CUDNN_HOME=$cudnn)
}
find_cudnn
[ -n "$cudnn_libs" ] && [ "$stage" != cudnn ] && export "${with_cudnn[@]:1}"
install_rlsmoke() { python3 -m pip install -q --no-index --no-deps --no-build-isolation -e "$here" > /dev/null 2>&1; }
keep_runs() {  # keep_runs FOLDER: the runs' logs and records in OUT/runs.tgz, without checkpoints or rollout files
  tar -czf "$out/runs.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.distcp' --exclude='*_torch_dist' \
    -C "$out" "$1" 2>/dev/null
}

case $stage in
receive)
  mv -f "$here"/.miles-carry/* "$env_dir/carry/" && ls -la "$env_dir/carry" ;;
misc)
  cd "$env_dir/carry" && read -r _ misc_bytes < <(grep '^misc ' sizes) || exit 2
  timed unpack-misc bash -c "cat piece-* | head -c $misc_bytes | xz -d | tar -x -C $env_dir"
  install_rlsmoke
  # The build goes on in a session of its own while the next pieces travel; `te` waits for it.
  rm -f "$env_dir/build.done"
  setsid nohup bash "$here/bench/gpu_miles_train_only.sh" build "$env_dir/build-out" > "$env_dir/build.log" 2>&1 < /dev/null &
  cat "$out/timing.txt"; echo "build: started in the background (pid $!), log $env_dir/build.log" ;;
build)
  # No binary wheel exists: build it against this host's torch and CUDA toolkit. cudnn.h and nccl.h come
  # from the host's pip packages (the toolkit has neither); TE's core is loaded at run time. torch's
  # CppExtension links no libtorch_cuda, and --as-needed would drop what it does link: both named here.
  mkdir -p "$env_dir/build" && tar -xzf "$env_dir"/sdist/transformer_engine_torch-*.tar.gz -C "$env_dir/build"
  nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
  timed te-torch-build env NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=16 CPLUS_INCLUDE_PATH=$nv/cudnn/include:$nv/nccl/include \
    LDFLAGS="-Wl,--no-as-needed -ltorch -ltorch_cuda -lc10_cuda" \
    python3 -m pip wheel -v --no-build-isolation --no-deps -w "$env_dir/wheel" "$env_dir"/build/transformer_engine_torch-*/
  timed te-torch python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$env_dir"/wheel/transformer_engine_torch-*.whl
  # The wheel leaves TE's torch library in the build tree (seen on the H200, 2026-12-05); TE looks for it
  # beside its package, so it goes into the site where none is.
  so=$(ls "$env_dir"/build/transformer_engine_torch-*/build/lib.*/transformer_engine/wheel_lib/transformer_engine_torch*.so 2>/dev/null | head -1)
  if [ -n "$so" ] && ! ls "$site"/transformer_engine_torch*.so > /dev/null 2>&1; then cp "$so" "$site/"; fi
  timed probe-ray timeout 180 python3 -c 'import ray; ray.init(num_gpus=1, include_dashboard=False); print(ray.cluster_resources()); ray.shutdown()'
  timed prepare timeout "$(left)" python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' prepare glm4.5-355b-a32b-4layer
  touch "$env_dir/build.done" ;;
te)
  cd "$env_dir/carry" && grep ' piece-' SHA256SUMS | sha256sum -c --quiet || { echo "error: [bench.carry] a piece is missing or torn"; exit 2; }
  read -r _ misc_bytes < <(grep '^misc ' sizes)
  timed unpack-te bash -c "cat piece-* | tail -c +$((misc_bytes + 1)) | xz -d | tar -x -C $env_dir"
  until [ -f "$env_dir/build.done" ] || [ "$(left)" -lt 60 ]; do sleep 5; done  # the misc stage's build
  cat "$env_dir/build-out/timing.txt"; tail -n 5 "$env_dir"/build-out/{te-torch-build,probe-ray,prepare}.txt
  [ -n "${LEAN:-}" ] || timed probe-te timeout 180 python3 -c 'import torch, transformer_engine.pytorch as te; l = te.Linear(256, 256, params_dtype=torch.bfloat16).cuda(); print(l(torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)).shape, te.__file__)'
  # Miles' converter now, so that the suite's runs find the torch_dist checkpoint made (their model dir)
  cd "$here" && timed convert timeout "$(left)" python3 bench/miles_convert.py glm4.5-355b-a32b-4layer --launcher miles \
    --train-only --miles-root "$RLSMOKE_MILES_ROOT" --megatron-root "$RLSMOKE_MEGATRON_ROOT" --platform nvidia \
    --num-gpus 1 --model-dir "$RLSMOKE_MILES_MODELS" --out "$out/convert"
  cat "$out/timing.txt"; tail -n 5 "$out"/probe-*.txt "$out/convert.txt" ;;
cudnn)
  cd "$env_dir/carry" && grep ' cudnn-' SHA256SUMS | sha256sum -c --quiet || { echo "error: [bench.carry] a cudnn-* piece is missing or torn"; exit 2; }
  cat cudnn-* > cudnn.whl && timed unpack-cudnn python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nvidia/cudnn/lib/")])' cudnn.whl "$env_dir"
  rm -f cudnn.whl
  find_cudnn
  # its RUNPATH finds NVRTC and cuBLAS two folders up, where the host's pip packages keep them
  nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
  for lib in cu13 cuda_nvrtc cublas; do [ -e "$nv/$lib" ] && ln -sfn "$nv/$lib" "$env_dir/nvidia/$lib"; done
  cd "$here"
  [ -n "${LEAN:-}" ] || timed attention-host-cudnn timeout 300 python3 bench/te_attention_probe.py
  timed attention-miles-cudnn timeout 300 "${with_cudnn[@]}" python3 bench/te_attention_probe.py
  cat "$out/timing.txt"; tail -n 3 "$out"/attention-*.txt ;;
suite)
  shift 2
  install_rlsmoke
  cd "$here" && timed suite timeout "$(left)" python3 -m pytest -p no:cacheprovider -m nvidia -x -v \
    tests/e2e/test_miles_train_only_nvidia.py --junitxml "$out/junit.xml" --artifacts-dir="$out/artifacts" --basetemp "$out/pt" "$@"
  keep_runs pt
  for log in "$out"/pt/*/*/run.log; do [ -f "$log" ] && { echo "== $log"; tail -25 "$log"; }; done
  tail -40 "$out/suite.txt"; cat "$out/timing.txt"
  [ -s "$RLSMOKE_STANDIN_LOG" ] && { echo "stand-ins used:"; cat "$RLSMOKE_STANDIN_LOG"; } || echo "stand-ins used: none" ;;
seeds)
  # --repeat: one launch, step i on seed i's rollout; killed at the budget, its log still gives each step's time
  install_rlsmoke
  cd "$here" && timed seeds timeout "$(left)" python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' \
    run glm4.5-355b-a32b-4layer --launcher miles --train-only --miles-root "$RLSMOKE_MILES_ROOT" \
    --megatron-root "$RLSMOKE_MEGATRON_ROOT" --platform nvidia --num-gpus 1 --model-dir "$RLSMOKE_MILES_MODELS" --repeat 10 --out "$out/seeds"
  [ -f "$out/seeds/summary.json" ] && timed calibrate python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' \
    calibrate "$out/seeds" --write "$out/miles-calibrated.json"
  grep -ho "'perf/\(log_probs_time\|actor_train_time\|step_time\)': [0-9.]*" "$out/seeds/run.log" > "$out/step-times.txt"
  keep_runs seeds
  tail -n 15 "$out/seeds.txt" "$out/calibrate.txt" 2>/dev/null; cat "$out/step-times.txt" "$out/timing.txt" ;;
esac
