#!/usr/bin/env bash
# Install Isaac Lab 3.0.0 kit-less (Newton physics, Newton Warp cameras; no Isaac Sim) and dz-gym for the
# DROID task dz_gym.envs.isaac_droid3, then convert its USD assets once. Needs Python 3.12 and a CUDA GPU.
#
# Usage: bash scripts/setup_isaac3.sh [--wheels DIR] [--target DIR]
#   (default)      a virtual environment .venv-isaac3 (VENV overrides), packages from the index
#   --wheels DIR   install only from the wheels in DIR (a machine without network: pip download them
#                  elsewhere; docs/isaac.md lists them)
#   --target DIR   install into DIR (pip --target) for an existing Python 3.12 that already has torch 2.11
#                  (then export PYTHONPATH=DIR); only the listed packages that Python (or DIR) lacks, or
#                  has at another version, are installed (scripts/missing_requirements.py), so --wheels
#                  needs wheels of those alone
#
# Isaac Lab's own requirement list is long (open3d, pin, imgui ...); it is installed --no-deps, with only
# what the kit-less manager-based path imports: scripts/isaac3_kitless.txt says which and why.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=""
target=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels=${2:?--wheels needs a folder}; shift 2 ;;
    --target) target=${2:?--target needs a folder}; shift 2 ;;
    *) echo "setup_isaac3: unknown option $1 (expected --wheels DIR, --target DIR)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-$(command -v python3.12 || echo python3)}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  echo "setup_isaac3: Isaac Lab 3.0 needs Python 3.12; set PYTHON to a python3.12" >&2
  exit 2
fi

# The package list, one requirement a line (# comments): scripts/isaac3_kitless.txt.
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' scripts/isaac3_kitless.txt)
opts=(-q --disable-pip-version-check --no-deps)
[ -n "$wheels" ] && opts+=(--no-index --find-links "$wheels")

if [ -n "$target" ]; then
  "$PYTHON" -c 'import torch' || { echo "setup_isaac3: --target needs a Python with torch 2.11 (CUDA)" >&2; exit 2; }
  export PYTHONPATH="$target:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  lacking_text=$("$PYTHON" scripts/missing_requirements.py "${packages[@]}")
  mapfile -t lacking <<<"$lacking_text"
  [ -n "$lacking_text" ] || lacking=()
  if [ ${#lacking[@]} -gt 0 ]; then
    echo "setup_isaac3: installing into $target: ${lacking[*]}"
    "$PYTHON" -m pip install "${opts[@]}" --no-compile --target "$target" "${lacking[@]}"
  fi
  py="$PYTHON"
else
  VENV=${VENV:-.venv-isaac3}
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  py="$VENV/bin/python"
  # torch 2.11 with CUDA 13 (Isaac Lab 3.0's pin) and its CUDA libraries: resolved with dependencies.
  "$py" -m pip install -q --disable-pip-version-check ${wheels:+--no-index --find-links "$wheels"} \
    "torch==2.11.0" "torchvision==0.26.0" scipy
  "$py" -m pip install "${opts[@]}" "${packages[@]}"
  "$py" -m pip install "${opts[@]}" -e .
  "$py" -m pip uninstall -q -y usd-core 2>/dev/null || true
fi

# Convert the robot, table and scene objects to USD once (cached; see dz_gym/envs/isaac_droid3/assets.py).
"$py" - <<'EOF'
from dz_gym.envs.isaac_droid3 import assets
for scene in (1, 2, 3):
    print("setup_isaac3: scene", scene, assets.scene_assets(scene))
EOF
echo "setup_isaac3: done; run e.g. dz-gym-eval --backend isaac --task DZ-DROID-CubeInBowl-Newton-v0 --num-envs 64 --policy reference"
