#!/usr/bin/env bash
# Train the shipped default model into models/default, reproducibly (same inputs + seed -> same model).
#
#   training/train_default.sh            # from the repository root, after `pip install -e '.[all]'`,
#                                        # with the shared data at ../shared/data
#
# Corpus: the TRAINING side of every real set we have (held-out sides stay out, so
# docs/training.md and bench/RESULTS.md can measure the default on them), balanced so no
# system dominates, plus simulated runs of six topologies:
#   - SWE-bench Verified runs, mini-swe-agent + gemini-3-pro: the django runs (all);
#   - MINT, 24 models x 6 task families, one- and two-agent: MINT_N runs of the training tasks;
#   - InterCode SQL and Bash, 4 models x 3 prompting strategies: IC_N runs of the training tasks;
#   - `stopserve simulate --run-to-cap`: SIM_N runs.
# Trained to transfer to systems it has never seen (docs/training.md, "The default model"):
#   --cost-scale per-run   costs normalised per data set; served, lambda comes from each run's own
#                          expected total cost, so a 1k-token system and a 1M-token one weigh alike
#   --features scale-free  no absolute sizes (tokens, dollars, seconds) and no topology
#   --cost-share 0.3       "a whole run costs 30% of what a success is worth" (a request can say otherwise)
# and its base rule can only be a reward threshold or the loop detector (no turn or cost cap).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-models/default}
MINT_N=${MINT_N:-4000}
IC_N=${IC_N:-4000}
SIM_N=${SIM_N:-2000}
SEED=${SEED:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python - "$SHARED" "$work" "$MINT_N" "$IC_N" <<'PY'
import sys
from pathlib import Path
from stopserve.training.corpus import REAL_SETS, import_set, split_file, subsample_file

shared, work, mint_n, ic_n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
limits = {"swe": None, "mint": mint_n, "intercode": ic_n}
for name, spec in REAL_SETS.items():
    full = import_set(name, shared, work / "imported")
    train, test = work / f"{name}-train.jsonl", work / f"{name}-test.jsonl"
    n_train, n_test = split_file(full, train, test, spec.split_by)
    kept = n_train if limits[name] is None else subsample_file(train, train, limits[name])
    print(f"{name}: {n_train} training runs ({kept} kept), {n_test} held out", file=sys.stderr)
PY
stopserve simulate --n "$SIM_N" --seed 10 --run-to-cap -o "$work/sim-train.jsonl"

stopserve train "$work/swe-train.jsonl" "$work/mint-train.jsonl" "$work/intercode-train.jsonl" \
  "$work/sim-train.jsonl" -o "$work/model" --cost-scale per-run --cost-share 0.3 --features scale-free \
  --seed "$SEED" --no-progress

# record how the model was made in its manifest (and so in the generated, hashed MODEL_CARD.md)
python - "$work/model" "$MINT_N" "$IC_N" "$SIM_N" "$SEED" <<'PY'
import sys
from stopserve.artifacts import load_model_dir, save_model_dir

path, mint_n, ic_n, sim_n, seed = sys.argv[1:]
art = load_model_dir(path)
manifest = {k: v for k, v in art.manifest.items() if k not in ("format", "files")}
data = dict(manifest.get("training_data") or {})
data["command"] = f"MINT_N={mint_n} IC_N={ic_n} SIM_N={sim_n} SEED={seed} training/train_default.sh"
data["sources"] = (
    "training sides only (stopserve.training.corpus): SWE-bench Verified django runs (mini-swe-agent, "
    f"gemini-3-pro); MINT, {mint_n} runs of the training tasks (24 models, 6 task families, one- and "
    f"two-agent); InterCode SQL and Bash, {ic_n} runs of the training tasks (4 models, 3 strategies); "
    f"{sim_n} simulated runs (stopserve simulate --run-to-cap --seed 10, six topologies)"
)
data["objective"] = (
    "cost share 0.3 (a whole run costs 30% of what a success is worth), per run: lambda comes from each "
    "run's own expected total cost, so a request's cost_share or lambda moves the trade-off"
)
data["good_for"] = (
    "systems it has not seen: stopping stalled runs (repeated results, errors, wrong answers) earlier "
    "than the loop detector, stopping when a quality reward says the work is good enough (base rule: a "
    "reward threshold, overruled while the run still improves), leaving productive runs alone"
)
data["not_good_for"] = (
    "your own system's costs and success rates: it reads no token, dollar or time sizes and no topology; "
    "train your own with `stopserve train` on your traces (it ships only if it beats the heuristics "
    "tuned on them). Runs with no reward signal (like the SWE runs) get little from it beyond the nets"
)
manifest["training_data"] = data
save_model_dir(path, manifest, art.models)
PY

rm -rf "$OUT.new" && cp -r "$work/model" "$OUT.new"
rm -rf "$OUT" && mv "$OUT.new" "$OUT"
chmod -R u+rwX,go+rX "$OUT"  # mktemp made it private; the image runs as another user
du -sh "$OUT"
echo "wrote $OUT"
