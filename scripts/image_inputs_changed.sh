#!/usr/bin/env bash
# Prints "image=true" when a file the image holds changed since BASE, else "image=false"
# (a GitHub Actions step output). The inputs are read from the Dockerfile's own COPY lines,
# plus the Dockerfile and this workflow, so a new COPY can never be missed by a list kept
# elsewhere. Unknown history (a first push, a force push, no BASE) builds: when in doubt,
# rebuild.
# Usage: scripts/image_inputs_changed.sh EVENT BASE   (EVENT: push, pull_request, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
event="${1:-}"
base="${2:-}"

build() {
  echo "image=$1"
  echo "image inputs: $2" >&2
  exit 0
}

[ "$event" = workflow_dispatch ] && build true "manual run"
if [ -z "$base" ] || [ -z "${base//0/}" ] || ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  build true "no base commit to compare with (${base:-none})"
fi

# COPY [--flags] SRC... DEST: every word but the flags and the last one (a COPY --from=
# copies from another stage, whose own COPY lines name the files)
mapfile -t inputs < <(
  awk 'toupper($1) == "COPY" && !/--from=/ { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' Dockerfile
)
inputs+=(Dockerfile .dockerignore .github/workflows/ci.yml)

range="$base..HEAD"
[ "$event" = pull_request ] && range="$base...HEAD" # since the merge base: the PR's own changes
while IFS= read -r changed; do
  for input in "${inputs[@]}"; do
    input="${input%/}"
    if [ "$changed" = "$input" ] || [[ "$changed" == "$input"/* ]]; then
      build true "$changed changed"
    fi
  done
done < <(git diff --name-only "$range")
build false "none of ${inputs[*]} changed"
