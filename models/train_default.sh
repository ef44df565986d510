#!/usr/bin/env bash
# Train the shipped default model into models/default, reproducibly (same inputs + seed -> same model).
#
#   models/train_default.sh                 # from the repository root, after `pip install -e '.[all]'`
#   N=4000 SEED=0 LAMBDA=0.0002 SWE_DIR=../shared/data/swe-verified-gemini3-train models/train_default.sh
#
# Inputs: N simulated orchestration traces (`stopserve simulate`, every topology, known optimal stop)
# plus the shared real mini-swe-agent runs when SWE_DIR exists. Costs are in thousands of tokens, the
# unit both sources carry. The command and its settings are written into the model card.
#
# LAMBDA (reward given up per 1000 tokens) defaults to 0.0002, not the trainer's 0.002: at 0.002 a
# real SWE run (~600k tokens) costs more than a success is worth, and the tuned policy stopped
# every real run at once (measured: `stopserve train swe.jsonl --cost-unit ktokens` -> "turn cap 1",
# CV success 0.000 vs 0.765 logged); mixed with simulated runs it shipped a 5k-token cap. Users
# set their own trade-off per request with "lambda".
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-4000}
SEED=${SEED:-0}
LAMBDA=${LAMBDA:-0.0002}
SWE_DIR=${SWE_DIR:-../shared/data/swe-verified-gemini3-train}
OUT=${OUT:-models/default}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

inputs=()
stopserve simulate --n "$N" --seed "$SEED" -o "$work/simulated.jsonl"
inputs+=("$work/simulated.jsonl")
used_swe=no
if [ -d "$SWE_DIR" ]; then
  stopserve import mini-swe-agent "$SWE_DIR" -o "$work/swe.jsonl" --no-progress
  inputs+=("$work/swe.jsonl")
  used_swe=yes
fi

stopserve train "${inputs[@]}" -o "$work/model" --cost-unit ktokens --lambda "$LAMBDA" --seed "$SEED" --no-progress

# record how the model was made in its manifest (and so in the generated, hashed MODEL_CARD.md)
python - "$work/model" "$N" "$SEED" "$used_swe" "$LAMBDA" <<'PY'
import sys
from stopserve.artifacts import load_model_dir, save_model_dir

path, n, seed, swe, lam = sys.argv[1:]
art = load_model_dir(path)
manifest = {k: v for k, v in art.manifest.items() if k not in ("format", "files")}
data = manifest.get("training_data")
data = dict(data) if isinstance(data, dict) else {}
data["command"] = f"N={n} SEED={seed} LAMBDA={lam} models/train_default.sh"
data["sources"] = f"stopserve simulate --n {n} --seed {seed}" + (
    " + the shared SWE-bench Verified mini-swe-agent runs" if swe == "yes" else " (no real runs found)"
)
manifest["training_data"] = data
save_model_dir(path, manifest, art.models)
PY

rm -rf "$OUT.new" && cp -r "$work/model" "$OUT.new"
rm -rf "$OUT" && mv "$OUT.new" "$OUT"
chmod -R u+rwX,go+rX "$OUT"  # mktemp made it private; the image runs as another user
du -sh "$OUT"
echo "wrote $OUT"
