#!/usr/bin/env bash
# Install everything benchfarm needs on a fresh Debian machine, idempotently.
#   scripts/setup.sh          system packages + .venv with the runtime dependencies
#   scripts/setup.sh test     ... plus the test dependencies (pytest, ruff, torch, transformers)
#   scripts/setup.sh train    ... as test, plus python3.11-doc: the text models/train_lm.py
#                             trains the shipped language model on (not needed otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  git build-essential python3 python3-venv python3-dev
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static   # aarch64 cross build + emulation
  openssh-server openssh-client                                    # the local farm
  clang                                                            # libFuzzer target
  chromium                                                         # report rendering test
  postgresql                                                       # the store on a non-SQLite URL
  procps util-linux                                                # taskset, ps for fingerprints
  cmake ninja-build g++ g++-aarch64-linux-gnu                      # llama.cpp (llama-bench engine)
)
if [ "${1:-}" = "test" ] || [ "${1:-}" = "train" ]; then
  packages+=(chromium-driver)  # Selenium drives Debian's chromium: the dashboard test
fi
if [ "${1:-}" = "train" ]; then
  packages+=(python3.11-doc)   # /usr/share/doc/python3.11/html/_sources: models/pydoc-lm's data
fi
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = "test" ] || [ "${1:-}" = "train" ]; then
  # torch is pinned: that CPU build is the one the machines here carry; transformers is the
  # independent numerical reference for the engine.
  .venv/bin/python -m pip install -q -e '.[test]'
else
  .venv/bin/python -m pip install -q -e .
fi
