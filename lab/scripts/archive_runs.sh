#!/usr/bin/env bash
# Keep a study's finished runs in the repository, without their checkpoints, so a study that outlasts one machine
# can be read back and continued: `compare` reads a run whose train_summary.json is there as finished.
#
#   lab/scripts/archive_runs.sh save runs/eval docs/results/data/eval        # one .tar.gz per finished run (kept as is)
#   lab/scripts/archive_runs.sh restore docs/results/data/eval runs/eval     # unpack them; then rerun the compare command
#
# A run archive holds config.yaml, run_settings.json, train_summary.json, metrics.jsonl and predictions.jsonl
# (about 40 KB compressed); the pair's shared start evaluations (before_*.json) go in a file of their own.
set -euo pipefail
usage() { echo "usage: lab/scripts/archive_runs.sh save RUNS_DIR ARCHIVE_DIR | restore ARCHIVE_DIR RUNS_DIR" >&2; exit 2; }
[ $# -eq 3 ] || usage
mode=$1 src=$2 dst=$3
[ -d "$src" ] || { echo "archive_runs: not a directory: $src" >&2; exit 2; }
case $mode in
save)
  mkdir -p "$dst"
  n=0
  for summary in "$src"/*/*seed*/train_summary.json; do
    [ -e "$summary" ] || continue
    run=$(dirname "$summary"); method=$(basename "$(dirname "$run")"); pair=$(basename "$run")
    out="$dst/$method--$pair.tar.gz"
    [ -e "$out" ] && continue  # a finished run does not change: its archive is written once
    files=()
    for f in config.yaml run_settings.json train_summary.json metrics.jsonl predictions.jsonl; do
      [ -e "$run/$f" ] && files+=("$method/$pair/$f")
    done
    tar -C "$src" -czf "$out" "${files[@]}"
    n=$((n + 1))
  done
  befores=$(cd "$src" && ls before_*.json 2>/dev/null || true)
  [ -n "$befores" ] && tar -C "$src" -czf "$dst/starts.tar.gz" $befores
  echo "archive_runs: $n new run archive(s) in $dst"
  ;;
restore)
  mkdir -p "$dst"
  for f in "$src"/*.tar.gz; do
    [ -e "$f" ] && tar -C "$dst" -xzf "$f"
  done
  echo "archive_runs: restored $(ls "$src"/*--*.tar.gz 2>/dev/null | wc -l) run(s) into $dst"
  ;;
*) usage ;;
esac
