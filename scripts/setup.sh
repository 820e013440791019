#!/usr/bin/env bash
# Install dz-gym into a local virtual environment (.venv), with the system libraries the embedded
# simulator renders with. Usage: bash scripts/setup.sh [--test] [--isaac22 | --isaac30]
#   --test     also installs the test tools and the PyPI peers the interoperability tests run against.
#   --isaac22  builds the environment of Isaac Lab 2.2 users instead (the second CI environment), in
#              .venv-isaac22 unless VENV is set: Python 3.11 and the versions sim-evals' lock and its
#              websockets>=16 override give them (numpy 1.26.0, gymnasium 1.2.0, websockets 16.x), with
#              torch 2.13.0 (the CPU build here; Isaac Lab brings its own CUDA build). With --test it adds
#              the real isaaclab 2.2.0 wheel without its dependencies (no Isaac Sim, no CUDA torch), plus
#              only what the tests' import paths of it need (tests/test_isaac_wheels.py).
#   --isaac30  builds the Isaac Lab 3.0 test environment (the third CI environment), in .venv-isaac30
#              unless VENV is set: Python 3.12 (PYTHON, default python3.12), dz-gym with pytest, and the real
#              isaaclab 3.0.0 wheel without its dependencies, plus only what its import paths need: the
#              torch 2.11.0 it pins (PyPI's build for 3.12 is the CUDA one: it imports and runs on a CPU
#              once the CUDA libraries it links are there) and the kit-less stack of setup_isaac3.sh
#              (scripts/isaac3_kitless.txt: newton, warp-lang, mujoco-warp, the converter ...).
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
want_isaac22=0
want_isaac30=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --isaac22) want_isaac22=1 ;;
    --isaac30) want_isaac30=1 ;;
    *) echo "setup: unknown option $arg (expected --test, --isaac22, --isaac30)" >&2; exit 2 ;;
  esac
done
if [ $want_isaac30 = 1 ]; then
  if [ -z "${PYTHON:-}" ]; then  # python3.12 on PATH, else a pyenv-installed 3.12
    for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
      if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then PYTHON=$candidate; break; fi
    done
  fi
  PYTHON=${PYTHON:-python3}
  VENV=${VENV:-.venv-isaac30}
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "setup: --isaac30 needs Python 3.12 (Isaac Lab 3.0's); set PYTHON to a python3.12" >&2
    exit 2
  fi
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  # torch 2.11.0 as isaaclab 3.0.0 pins it, without its dependencies: of the CUDA packages only the
  # libraries libtorch_cuda.so links (nothing of CUDA runs here), and its pure-Python dependencies.
  "${pip[@]}" --no-deps "torch==2.11.0" "nvidia-cublas==13.1.1.3" "nvidia-cudnn-cu13==9.24.0.43" \
    "nvidia-cufft==12.0.0.61" "nvidia-cufile==1.15.1.6" "nvidia-curand==10.4.0.35" "nvidia-cusparse==12.6.3.3" \
    "nvidia-cusparselt-cu13==0.8.1" "nvidia-nccl-cu13==2.30.7" "nvidia-nvshmem-cu13==3.4.5" "nvidia-nvjitlink==13.4.92"
  "${pip[@]}" "filelock" "typing-extensions>=4.10" "sympy>=1.13.3" "networkx" "jinja2" "fsspec"
  # Isaac Lab 3.0.0 kit-less as scripts/setup_isaac3.sh installs it (the same list, --no-deps: isaaclab,
  # newton, warp-lang, mujoco-warp, the MJCF-to-USD converter ...), so the kit-less task builds here on
  # Warp's CPU device; then dz-gym (its own dependencies) and the test runner.
  mapfile -t kitless < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' scripts/isaac3_kitless.txt)
  "${pip[@]}" --no-deps "${kitless[@]}"
  "${pip[@]}" "toml" -e . "pytest>=8" "pytest-timeout>=2.2"
  exit 0
fi
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
    # the experiment trackers (--log) only in the first environment: the logging tests skip without them
    "${pip[@]}" -e ".[mujoco,test,plot,wandb,tensorboard]" "torch==2.13.0"
  fi
  # openpi-client pins numpy<2 and forgets typing_extensions: install it without its pins, next to the
  # dependencies it really uses (pillow, dm-tree, typing-extensions come with the test extra).
  "${pip[@]}" --no-deps "openpi-client==0.1.2" "openpi-server==0.1.0"
  # SGLang's real /openpi/policy route (dz_gym.testing.sglang_real): the wheel without its dependency tree
  # (its LLM runtime, triton, CUDA kernels); the route's own files need only fastapi and uvicorn (test extra).
  "${pip[@]}" --no-deps "sglang==0.5.23"
  if [ $want_isaac22 = 1 ]; then
    # The real isaaclab 2.2.0 wheel, without its dependencies, and what importing its launcher, config
    # classes and mdp terms needs (its pins where it pins). Isaac Sim's own modules are faked by the tests.
    # flatdict 4.0.1 is an sdist whose build needs pkg_resources (setuptools < 81 in its build env).
    echo "setuptools<81" >"$VENV/build-constraints.txt"
    PIP_CONSTRAINT="$VENV/build-constraints.txt" "${pip[@]}" --no-deps "flatdict==4.0.1"
    "${pip[@]}" --no-deps "isaaclab==2.2.0" "toml==0.10.2" "prettytable==3.3.0" "wcwidth==0.9.4" \
      "h5py==3.16.0" "trimesh==5.2.0" "hidapi==0.14.0.post2" "warp-lang==1.8.1" "usd-core==26.11"
  fi
else
  "${pip[@]}" -e ".[mujoco]" ${pins[@]+"${pins[@]}"}
fi
