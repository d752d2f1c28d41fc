#!/usr/bin/env bash
# `ampmigrate verify --device cuda` over verify projects, on a machine with a GPU (the device check
# of issues 12 and 16). Usage, from the repository root:
#   bench/gpu/verify_gpu.sh OUTDIR STEPS RUNS 'SCRIPT [VERIFY OPTIONS] [-- SCRIPT ARGS]' ...
# PYTHONPATH must hold this repository (absolute) where ampmigrate is not installed. Each
# project's verdict, wall time and output go to OUTDIR/verify_gpu.log; each full result
# (curves, timings, peak memory, verdict) to OUTDIR/verify_gpu.json, keyed by the spec.
set -u
out=${1:?OUTDIR}; steps=${2:?STEPS}; runs=${3:?RUNS}; shift 3
mkdir -p "$out"
log="$out/verify_gpu.log"
: >"$log"
python3 - >>"$log" 2>&1 <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0),
      "bf16:", torch.cuda.is_bf16_supported())
PY
n=0; pairs=()
for spec in "$@"; do
  n=$((n + 1))
  script=${spec%% *}; rest=""; [ "$spec" != "$script" ] && rest=${spec#* }
  started=$(date +%s)
  # Run from the script's folder, as its user would (scripts read config.json and the like there).
  # shellcheck disable=SC2086  # the spec's options are words on purpose
  (cd "$(dirname "$script")" && timeout 150 python3 -m ampmigrate verify "$(basename "$script")" --device cuda \
      --steps "$steps" --runs "$runs" --json "/tmp/verify_gpu_$n.json" $rest) >"/tmp/verify_gpu_$n.txt" 2>&1
  rc=$?
  printf '=== %s | rc=%s wall=%ss\n' "$spec" "$rc" "$(( $(date +%s) - started ))" >>"$log"
  cat "/tmp/verify_gpu_$n.txt" >>"$log"
  pairs+=("$spec" "/tmp/verify_gpu_$n.json")
done
python3 - "$out/verify_gpu.json" "${pairs[@]}" <<'PY'
import json, os, sys
out, rest = sys.argv[1], sys.argv[2:]
combined = {}
for spec, path in zip(rest[::2], rest[1::2]):
    combined[spec] = json.load(open(path)) if os.path.exists(path) else None
json.dump(combined, open(out, "w"), indent=1)
PY
cat "$log"
