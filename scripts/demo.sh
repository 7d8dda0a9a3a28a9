#!/usr/bin/env bash
# The main job on embedded defaults: local Kafka broker + worker + bundled samples.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh  # memstream alone: no test tools, nothing compiled
exec .venv/bin/memstream demo "$@"
