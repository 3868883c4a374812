#!/usr/bin/env bash
# The static agent in a real container, driven over `docker exec -i` (not part of cargo test):
# busybox (no bash, no Python), a non-root sandbox user, the engine's /etc/hosts bind mount, the
# Code Mode relay and mcp-client, timeouts, a fork bomb against the pids limit, and the agent's
# figures over the engine's exec stream. Skips (exit 0) when no Docker engine answers.
# IMAGE picks the image (default trueforge-sandbox-busybox:1), RUNTIME the OCI runtime (runsc on
# the engine of scripts/engines/gvisor-engine.sh: DOCKER_HOST=$(scripts/engines/gvisor-engine.sh host)). The container is this script's
# own (named tf-agent-smoke-<pid>) and is removed on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/../.."

log() { printf '[agent-smoke] %s\n' "$*"; }
if ! docker info >/dev/null 2>&1; then
  log "skipped: no Docker engine answers"
  exit 0
fi
image=${IMAGE:-trueforge-sandbox-busybox:1}
arch=$(uname -m)
bin=target/agent/trueforge-agent-$arch
[ -x "$bin" ] || ARCHS=$arch bash scripts/build/build-agent.sh

name="tf-agent-smoke-$$"
cleanup() { docker rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
# As the provider makes sandboxes: docker-init as PID 1, every capability dropped but the
# defaults it keeps, no network, a pids limit.
docker create --name "$name" --init --network none --pids-limit "${PIDS_LIMIT:-64}" ${RUNTIME:+--runtime "$RUNTIME"} \
  --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER --cap-add FSETID \
  --cap-add KILL --cap-add SETGID --cap-add SETUID \
  --label trueforge.agent-smoke=1 "$image" sleep 3600 >/dev/null
docker cp "$bin" "$name:/trueforge-agent"
docker start "$name" >/dev/null
log "container $name from $image${RUNTIME:+ under $RUNTIME}"

TF_SMOKE_CONTAINER="$name" TRUEFORGE_AGENT_BIN=/trueforge-agent \
  TRUEFORGE_AGENT_RUNNER="docker exec -i -u 0 $name" \
  cargo test --locked -p trueforge-agent --test docker_smoke -- --ignored --nocapture --test-threads=1 ${SMOKE_TESTS:-}
