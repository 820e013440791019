#!/usr/bin/env bash
# Install dz-gym into a local virtual environment (.venv), with the system libraries the embedded
# simulator renders with. Usage: bash scripts/setup.sh [--test] [--isaac22]
#   --test     also installs the test tools and the PyPI peers the interoperability tests run against.
#   --isaac22  builds the environment of Isaac Lab 2.2 users instead (the second CI environment), in
#              .venv-isaac22 unless VENV is set: Python 3.11 and the versions sim-evals' lock and its
#              websockets>=16 override give them (numpy 1.26.0, gymnasium 1.2.0, websockets 16.x), with
#              torch 2.13.0 (the CPU build here; Isaac Lab brings its own CUDA build). No Isaac Lab.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
want_isaac22=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --isaac22) want_isaac22=1 ;;
    *) echo "setup: unknown option $arg (expected --test, --isaac22)" >&2; exit 2 ;;
  esac
done
if [ $want_isaac22 = 1 ]; then
  PYTHON=${PYTHON:-$(command -v python3.11 || echo python3)}
  VENV=${VENV:-.venv-isaac22}
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup: --isaac22 needs Python 3.11 (Isaac Lab 2.2's); set PYTHON to a python3.11" >&2
    exit 2
  fi
  pins=("numpy==1.26.0" "gymnasium==1.2.0" "websockets==16.*" "torch==2.13.0")
else
  PYTHON=${PYTHON:-python3}
  VENV=${VENV:-.venv}
  pins=()
fi

# Headless OpenGL for MuJoCo: Mesa EGL (works without a GPU through llvmpipe), OSMesa as the fallback.
need_apt=()
ldconfig -p | grep -q 'libEGL.so.1' || need_apt+=(libegl1)
ldconfig -p | grep -q 'libEGL_mesa.so.0' || need_apt+=(libegl-mesa0)
[ -e /usr/lib/x86_64-linux-gnu/dri/swrast_dri.so ] || [ -e /usr/lib/aarch64-linux-gnu/dri/swrast_dri.so ] || need_apt+=(libgl1-mesa-dri)
ldconfig -p | grep -q 'libOSMesa.so' || need_apt+=(libosmesa6)
# The report's browser tests (--test) drive Debian's Chromium through Playwright (never a downloaded browser).
if [ $want_test = 1 ] && ! command -v chromium >/dev/null; then need_apt+=(chromium); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need_apt[*]}"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install the Debian packages: ${need_apt[*]} (headless rendering)" >&2
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if [ $want_test = 1 ]; then
  # torch==2.13.0 resolves to the CPU build on a CPU machine; the tests use it for the torch code paths.
  if [ $want_isaac22 = 1 ]; then
    "${pip[@]}" -e ".[mujoco,test,plot]" "${pins[@]}"
  else
    "${pip[@]}" -e ".[mujoco,test,plot]" "torch==2.13.0"
  fi
  # openpi-client pins numpy<2 and forgets typing_extensions: install it without its pins, next to the
  # dependencies it really uses (pillow, dm-tree, typing-extensions come with the test extra).
  "${pip[@]}" --no-deps "openpi-client==0.1.2" "openpi-server==0.1.0"
else
  "${pip[@]}" -e ".[mujoco]" ${pins[@]+"${pins[@]}"}
fi
