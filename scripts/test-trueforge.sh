#!/usr/bin/env bash
# npm run test:trueforge -- <path to a TrueForge checkout>   (or TRUEFORGE_DIR=<path>)
#
# Runs, inside a TrueForge checkout and under its own jest config:
#   1. TrueForge's SandboxProvider contract suite, with a factory that builds DockerSandboxProvider;
#   2. our integration test of TrueForge's real Sandbox class over DockerSandboxProvider.
# The package goes in as a user gets it: `npm pack` here, `npm install` of the tarball in a scratch
# folder, a symlink packages/trueforge-core/node_modules/trueforge-docker-sandbox to it. Our test
# files (__test__/trueforge/) are copied into a temporary folder under
# packages/trueforge-core/tests/ and removed afterwards, as are the symlink and the scratch folder,
# whatever happens.
#
# Skips (exit 0, saying why) without a checkout or without a Docker engine.
# Needs Node >= 22 for TrueForge: the first of `node` on PATH, $TRUEFORGE_NODE, or a node@22
# installed on demand into $TRUEFORGE_TOOLS_DIR (default ~/.cache/trueforge-docker-sandbox/tools).
# pnpm (only to install a checkout that has no node_modules yet) is found the same way.
# The sandbox image is $TRUEFORGE_SANDBOX_IMAGE (default trueforge-sandbox:2).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tf_dir=${1:-${TRUEFORGE_DIR:-}}
say() { printf 'test:trueforge: %s\n' "$*"; }
skip() { say "SKIPPED: $*"; exit 0; }

[ -n "$tf_dir" ] || skip "no TrueForge checkout given (npm run test:trueforge -- <dir>, or set TRUEFORGE_DIR)"
[ -d "$tf_dir" ] || skip "no TrueForge checkout at $tf_dir"
tf_dir=$(cd "$tf_dir" && pwd)
core="$tf_dir/packages/trueforge-core"
suite_rel="tests/core/sandbox/provider/sandboxProviderContractSuite.ts"
for f in "$core/jest.config.cjs" "$core/$suite_rel" "$core/src/core/sandbox/Sandbox.ts"; do
  [ -f "$f" ] || skip "$tf_dir does not look like a TrueForge checkout (no ${f#"$tf_dir"/})"
done
command -v docker >/dev/null 2>&1 || skip "no docker CLI on PATH (the tests need a Docker engine)"
docker info >/dev/null 2>&1 || skip "the Docker engine is not reachable (docker info failed)"

export TRUEFORGE_SANDBOX_IMAGE=${TRUEFORGE_SANDBOX_IMAGE:-trueforge-sandbox:2}
tools_dir=${TRUEFORGE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trueforge-docker-sandbox/tools}

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

# Node >= 22: $TRUEFORGE_NODE, then PATH, then the tools cache (installed there on first use).
find_node() {
  local c
  for c in "${TRUEFORGE_NODE:-}" "$(command -v node || true)" "$tools_dir/node_modules/.bin/node"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$(node_major "$c")" -ge 22 ]; then
      echo "$c"
      return
    fi
  done
  say "no Node >= 22 found; installing node@22 into $tools_dir" >&2
  mkdir -p "$tools_dir"
  (cd "$tools_dir" && npm install --no-audit --no-fund --silent node@22 >&2)
  c="$tools_dir/node_modules/.bin/node"
  [ "$(node_major "$c")" -ge 22 ] || { say "could not get Node >= 22" >&2; exit 1; }
  echo "$c"
}

find_pnpm() {
  local c
  c=$(PATH="$node_bin:$PATH" command -v pnpm || true)
  [ -z "$c" ] && [ -x "$tools_dir/node_modules/.bin/pnpm" ] && c="$tools_dir/node_modules/.bin/pnpm"
  if [ -z "$c" ]; then
    say "no pnpm found; installing pnpm into $tools_dir" >&2
    mkdir -p "$tools_dir"
    (cd "$tools_dir" && npm install --no-audit --no-fund --silent pnpm >&2)
    c="$tools_dir/node_modules/.bin/pnpm"
  fi
  echo "$c"
}

node22=$(find_node)
node_bin=$(dirname "$node22")
say "node $("$node22" --version) ($node22)"

if [ ! -x "$core/node_modules/.bin/jest" ]; then
  pnpm=$(find_pnpm)
  say "the checkout has no node_modules; running pnpm install there"
  (cd "$tf_dir" && PATH="$node_bin:$PATH" "$pnpm" install) || {
    say "pnpm install failed in $tf_dir; install the checkout by hand (see docs/trueforge.md) and rerun"
    exit 1
  }
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/tf-docker-sandbox.XXXXXX")
tests_tmp="$core/tests/docker-sandbox-$(basename "$scratch" | tr -dc 'a-zA-Z0-9')"
link="$core/node_modules/trueforge-docker-sandbox"
moved_aside=""
# Every namespace the tests make carries this tag; the sweep below removes what a killed run left.
export TRUEFORGE_TEST_RUN_TAG
TRUEFORGE_TEST_RUN_TAG=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
sweep_containers() {
  local ids
  ids=$(docker ps -a --filter label=trueforge.sandbox.namespace \
    --format '{{.ID}} {{.Label "trueforge.sandbox.namespace"}}' 2>/dev/null |
    awk -v tag="-$TRUEFORGE_TEST_RUN_TAG-" 'index($2, tag) { print $1 }')
  if [ -n "$ids" ]; then
    say "removing $(echo "$ids" | wc -l) container(s) left by this run"
    # shellcheck disable=SC2086
    docker rm -f -v $ids >/dev/null 2>&1 || true
  fi
}
cleanup() {
  sweep_containers
  rm -rf "$tests_tmp"
  if [ -L "$link" ] && [ "$(readlink "$link")" = "$scratch/consumer/node_modules/trueforge-docker-sandbox" ]; then
    rm -f "$link"
  fi
  [ -n "$moved_aside" ] && [ ! -e "$link" ] && mv "$moved_aside" "$link"
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "packing $(cd "$root" && node -p 'require("./package.json").name + "@" + require("./package.json").version')"
tarball=$(cd "$root" && npm pack --silent --pack-destination "$scratch" | tail -n 1)
mkdir -p "$scratch/consumer"
(
  cd "$scratch/consumer"
  npm init -y >/dev/null
  npm install --no-audit --no-fund --silent "$scratch/$tarball" >/dev/null
)

if [ -e "$link" ] || [ -L "$link" ]; then
  if [ -L "$link" ] && [[ "$(readlink "$link")" == */tf-docker-sandbox.*/consumer/* ]]; then
    rm -f "$link" # left by an earlier run that was killed
  else
    moved_aside="$scratch/previous-link"
    mv "$link" "$moved_aside"
  fi
fi
ln -s "$scratch/consumer/node_modules/trueforge-docker-sandbox" "$link"

mkdir -p "$tests_tmp"
cp "$root"/__test__/trueforge/*.ts "$tests_tmp/"
rel=${tests_tmp#"$core"/}
say "image $TRUEFORGE_SANDBOX_IMAGE; tests copied to $rel"

report="$scratch/report.json"
set +e
(
  cd "$core"
  PATH="$node_bin:$PATH" node_modules/.bin/jest --config jest.config.cjs --runInBand \
    --json --outputFile="$report" "$rel/"
)
rc=$?
set -e

if [ ! -s "$report" ]; then
  say "FAILED: jest wrote no report (exit $rc)"
  exit 1
fi
"$node22" - "$report" "$rc" <<'EOF'
const [report, rc] = process.argv.slice(2)
const r = require(report)
const parts = { 'docker-provider-contract.test.ts': 'TrueForge contract suite', 'docker-sandbox-class.test.ts': 'Sandbox class' }
const lines = []
for (const [file, label] of Object.entries(parts)) {
  const s = r.testResults.find((t) => t.name.endsWith(`/${file}`))
  if (!s) { lines.push(`${label}: did not run`); continue }
  const c = { passed: 0, failed: 0, skipped: 0 }
  for (const a of s.assertionResults) c[a.status === 'passed' ? 'passed' : a.status === 'failed' ? 'failed' : 'skipped']++
  const extra = s.status === 'failed' && c.failed === 0 ? ' (the file itself failed: ' + String(s.message).split('\n').find(Boolean) + ')' : ''
  lines.push(`${label}: ${c.passed} passed, ${c.failed} failed, ${c.skipped} skipped${extra}`)
}
console.log(`test:trueforge: ${lines.join('; ')}; total ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`)
if (Number(rc) !== 0 || !r.success) { console.log('test:trueforge: FAILED'); process.exit(1) }
console.log('test:trueforge: OK')
EOF
