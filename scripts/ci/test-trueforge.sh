#!/usr/bin/env bash
# npm run test:trueforge -- <TrueForge export at 5ccac3db>   (or TRUEFORGE_DIR=<dir>)
#
# Applies our patch series (integrations/trueforge/patches) to a copy of the given TrueForge tree
# and checks the result as TrueForge's own CI would, then end to end:
#   1. copy the tree (the given directory is only read), `git am` the series on it;
#   2. the environment-only changes an offline install here needs (integrations/trueforge/README.md):
#      no `packageManager` line, the UI and SDK packages out of the workspace, five pins under
#      `overrides:`, and our package from its packed tarballs (`npm run pack`) through an override
#      as the registry would serve it; `pnpm install --no-frozen-lockfile`;
#   3. TrueForge's checks for the core and server packages: typecheck, lint (eslint; errors known
#      on the untouched tree are listed in integrations/trueforge/lint-baseline.txt), format check,
#      unit tests, the SQLite store contract suites; the SDK's hand-written types with tsc and its
#      vitest suite and its formatter (biome); with $TRUEFORGE_UI_RUNTIME (a checkout of the UI
#      runtime at its locked tag), the UI files of the series with tsc, vitest and eslint
#      (integrations/trueforge/ui-check/run.mjs);
#   4. the opt-in suites of the series: `pnpm test:docker-sandbox:contract` and
#      `pnpm test:docker-sandbox:gpu` (which says why it skips without a GPU);
#   5. our tests of TrueForge's Sandbox class over the provider (__test__/trueforge/);
#   6. the standalone server (SQLite) end to end with a stub model and a stub MCP server on
#      loopback (integrations/trueforge/e2e/run.mjs).
# Every step prints its figures; what cannot run here is listed as skipped with the reason.
#
# Skips (exit 0, saying why) without a TrueForge tree or without a Docker engine. Needs Node >= 22
# and pnpm 11: $TRUEFORGE_NODE / `node` on PATH, else node@22 and pnpm@11 installed on demand into
# $TRUEFORGE_TOOLS_DIR (default ~/.cache/trueforge-docker-sandbox/tools). The addon must be built
# (`npm run build`); from a fresh clone this script runs `npm ci` and the build itself.
# $TRUEFORGE_SANDBOX_IMAGE picks the image (default trueforge-sandbox:2). $TRUEFORGE_KEEP=1 keeps
# the patched, installed copy (its path is printed). Every container a step creates is removed.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
src_dir=${1:-${TRUEFORGE_DIR:-}}
say() { printf 'test:trueforge: %s\n' "$*"; }
skip() {
  say "SKIPPED: $*"
  exit 0
}
fail() {
  say "FAILED: $*"
  exit 1
}

[ -n "$src_dir" ] || skip "no TrueForge tree given (npm run test:trueforge -- <dir>, or set TRUEFORGE_DIR)"
[ -d "$src_dir" ] || skip "no TrueForge tree at $src_dir"
src_dir=$(cd "$src_dir" && pwd)
for f in packages/trueforge-core/jest.config.cjs packages/trueforge/src/sandbox/providerUtils.ts pnpm-workspace.yaml; do
  [ -f "$src_dir/$f" ] || skip "$src_dir does not look like a TrueForge tree (no $f)"
done
command -v docker >/dev/null 2>&1 || skip "no docker CLI on PATH (the suites and the end-to-end run need a Docker engine)"
docker info >/dev/null 2>&1 || skip "the Docker engine is not reachable (docker info failed)"

image=${TRUEFORGE_SANDBOX_IMAGE:-trueforge-sandbox:2}
docker image inspect "$image" >/dev/null 2>&1 || fail "image $image is not on the engine (bash scripts/images/ensure-images.sh trueforge makes it)"
tools_dir=${TRUEFORGE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trueforge-docker-sandbox/tools}
patches_dir="$root/integrations/trueforge/patches"

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

# Node >= 22 and pnpm 11: $TRUEFORGE_NODE, then PATH, then the tools folder (filled on first use).
find_node() {
  local c
  for c in "${TRUEFORGE_NODE:-}" "$(command -v node || true)" "$tools_dir/node_modules/.bin/node"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$(node_major "$c")" -ge 22 ]; then
      echo "$c"
      return
    fi
  done
  say "no Node >= 22 found; installing node@22 and pnpm@11 into $tools_dir" >&2
  mkdir -p "$tools_dir"
  (cd "$tools_dir" && npm install --no-audit --no-fund --silent node@22 pnpm@11 >&2)
  c="$tools_dir/node_modules/.bin/node"
  [ "$(node_major "$c")" -ge 22 ] || fail "could not get Node >= 22"
  echo "$c"
}
find_pnpm() {
  local c
  c=$(PATH="$node_bin:$PATH" command -v pnpm || true)
  if [ -n "$c" ] && [ "$(PATH="$node_bin:$PATH" "$c" --version 2>/dev/null | cut -d. -f1)" = 11 ]; then
    echo "$c"
    return
  fi
  c="$tools_dir/node_modules/.bin/pnpm"
  if [ ! -x "$c" ] || [ "$(PATH="$node_bin:$PATH" "$c" --version | cut -d. -f1)" != 11 ]; then
    say "no pnpm 11 found; installing pnpm@11 into $tools_dir" >&2
    mkdir -p "$tools_dir"
    (cd "$tools_dir" && npm install --no-audit --no-fund --silent pnpm@11 >&2)
  fi
  echo "$c"
}
node22=$(find_node)
node_bin=$(dirname "$node22")
pnpm=$(find_pnpm)
export PATH="$node_bin:$(dirname "$pnpm"):$PATH"
say "node $("$node22" --version), pnpm $("$pnpm" --version); TrueForge tree $src_dir (only read); image $image"

# Every namespace this run makes ends in its tag, so the sweep removes exactly what a killed run left.
tag=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
export TRUEFORGE_TEST_RUN_TAG=$tag
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tf-docker-sandbox.XXXXXX")
work="$scratch/trueforge"
logs="$scratch/logs"
mkdir -p "$work" "$logs"
sweep_containers() {
  local ids
  ids=$(docker ps -a --filter label=trueforge.sandbox.namespace \
    --format '{{.ID}} {{.Label "trueforge.sandbox.namespace"}}' 2>/dev/null |
    awk -v tag="$tag" '$2 ~ ("-" tag "(-|$)") { print $1 }')
  if [ -n "$ids" ]; then
    say "removing $(echo "$ids" | wc -l) container(s) left by this run"
    # shellcheck disable=SC2086
    docker rm -f -v $ids >/dev/null 2>&1 || true
  fi
}
cleanup() {
  local rc=$?
  sweep_containers
  if [ "${TRUEFORGE_KEEP:-}" = 1 ] || [ "$rc" -ne 0 ]; then
    say "kept $scratch (the patched tree is $work; logs in $logs)"
  else
    rm -rf "$scratch"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

summary=()
note() { summary+=("$*"); }
# step NAME CMD...: runs CMD in the patched tree with its output in a log; prints the time taken.
step() {
  local name=$1 log
  shift
  log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9' '-' | cut -c1-60).log"
  local t0=$SECONDS
  printf '\n==> %s\n' "$name"
  if (cd "$work" && "$@") >"$log" 2>&1; then
    step_secs=$((SECONDS - t0))
    step_log=$log
    return 0
  fi
  step_secs=$((SECONDS - t0))
  tail -n 40 "$log"
  fail "$name (exit status above; full log $log)"
}
# The jest summary of a log: "Tests: 1 skipped, 374 passed, 375 total" -> "374 passed, 1 skipped (375), 38 suites"
jest_counts() {
  local tests suites
  tests=$(grep -E '^Tests:' "$1" | tail -n 1 | sed -E 's/^Tests: +//')
  suites=$(grep -E '^Test Suites:' "$1" | tail -n 1 | sed -E 's/^Test Suites: +//')
  echo "tests: $tests; suites: $suites"
}

# --- 1. the series on a copy
t_all=$SECONDS
printf '\n==> Copy the tree and apply the series (%s patches)\n' "$(ls "$patches_dir"/*.patch | wc -l)"
(cd "$src_dir" && tar --exclude=./.git --exclude='node_modules' --exclude='./packages/*/dist' -cf - .) | tar -C "$work" -xf -
(
  cd "$work"
  git init -q
  git add -A
  git -c user.name=base -c user.email=base@localhost commit -qm "TrueForge (as given)" --no-verify
  git -c user.name=test -c user.email=test@localhost am -q "$patches_dir"/*.patch
) >"$logs/apply.log" 2>&1 || {
  cat "$logs/apply.log"
  fail "the series does not apply with git am (is $src_dir an unpatched TrueForge 5ccac3db?)"
}
applied=$(git -C "$work" rev-list --count HEAD~"$(ls "$patches_dir"/*.patch | wc -l)"..HEAD)
say "applied $applied patches: $(git -C "$work" log --format=%s -n "$applied" --reverse | paste -sd '|' | sed 's/|/ | /g')"
note "series: $applied patches applied with git am"

# --- 2. our packages and the environment-only changes
printf '\n==> Pack this package (npm run pack) and install the tree\n'
bin="$(node -p "require('$root/package.json').napi.binaryName").$(node -e "
  const { platform, arch } = process
  const libc = platform === 'linux' ? (process.report.getReport().header.glibcVersionRuntime ? '-gnu' : '-musl') : ''
  process.stdout.write(platform + '-' + arch + libc)").node"
if [ ! -f "$root/$bin" ]; then
  say "no $bin: building the addon (npm ci, npm run build)"
  (cd "$root" && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && npm run build) >"$logs/build-addon.log" 2>&1 ||
    fail "building the addon failed (log $logs/build-addon.log)"
fi
(cd "$root" && bash scripts/build/pack.sh --out "$scratch/packages") >"$logs/pack.log" 2>&1 || {
  cat "$logs/pack.log"
  fail "npm run pack failed"
}
"$node22" - "$work" "$scratch/packages" <<'EOF'
// The environment-only changes (integrations/trueforge/README.md); never part of the series.
const fs = require('node:fs')
const path = require('node:path')
const [work, packages] = process.argv.slice(2)
const pkgFile = path.join(work, 'package.json')
const pkg = JSON.parse(fs.readFileSync(pkgFile, 'utf8'))
delete pkg.packageManager
fs.writeFileSync(pkgFile, JSON.stringify(pkg, null, 2) + '\n')
const wsFile = path.join(work, 'pnpm-workspace.yaml')
let ws = fs.readFileSync(wsFile, 'utf8')
ws = ws.replace(/^packages:\n(  - .*\n)+/m, (block) =>
  block + ["  - '!packages/frontend'", "  - '!packages/trueforge-ui'", "  - '!packages/trueforge-sdk'"].join('\n') + '\n')
const pins = {
  "'@daytona/sdk'": "'0.205.1'",
  "'@ai-sdk/provider'": "'4.0.19'",
  "'@ai-sdk/provider-utils'": "'5.0.51'",
  "'@ai-sdk/alibaba'": "'2.0.58'",
  "'@ai-sdk/moonshotai'": "'3.0.60'",
}
for (const f of fs.readdirSync(packages)) {
  if (f === 'main.tgz') pins['trueforge-docker-sandbox'] = `file:${path.join(packages, f)}`
  const m = /^(trueforge-docker-sandbox-.+)-\d+\.\d+\.\d+.*\.tgz$/.exec(f)
  if (m) pins[m[1]] = `file:${path.join(packages, f)}`
}
const lines = Object.entries(pins).map(([k, v]) => `  ${k}: ${v}`).join('\n') + '\n'
if (!/^overrides:\n/m.test(ws)) throw new Error('pnpm-workspace.yaml has no overrides: block')
ws = ws.replace(/^overrides:\n((?: {2}.*\n|\s*#.*\n)*)/m, (block) => block + lines)
fs.writeFileSync(wsFile, ws)
EOF
step "pnpm install --no-frozen-lockfile" pnpm install --no-frozen-lockfile
installed=$(node -p "require('$work/packages/trueforge/node_modules/trueforge-docker-sandbox/package.json').version")
say "installed in ${step_secs}s; trueforge-docker-sandbox $installed from $(ls "$scratch/packages" | paste -sd ' ')"
note "install: ${step_secs}s, trueforge-docker-sandbox $installed from the packed tarballs (main + $(ls "$scratch/packages" | grep -c -- '-[0-9.]*\.tgz$') platform)"

# --- 3. TrueForge's own checks, core and server
step "typecheck: trueforge-core (tsc)" pnpm --filter @truefoundry/trueforge-core typecheck
note "typecheck trueforge-core: 1 tsc program, 0 errors (${step_secs}s)"
step "typecheck: trueforge (tsc: src+scripts, tests/db, tests/unit)" pnpm --filter @truefoundry/trueforge typecheck
note "typecheck trueforge: 3 tsc programs, 0 errors (${step_secs}s)"

types_node=$(ls -d "$work"/node_modules/.pnpm/@types+node@20.*/node_modules/@types 2>/dev/null | head -n 1)
[ -n "$types_node" ] || types_node="$work/packages/trueforge/node_modules/@types"
step "typecheck: trueforge-sdk (tsc over the hand-written union types)" \
  node_modules/.bin/tsc -p packages/trueforge-sdk/tsconfig.json --noEmit --typeRoots "$types_node"
note "typecheck trueforge-sdk: $(find "$work/packages/trueforge-sdk/src" -name '*.ts' | wc -l) files, 0 errors (${step_secs}s)"

# The SDK's own tests (vitest: wire tests against a mock server, and unit tests). The package is out
# of the workspace, so its test tools (the versions its package.json names) come from npm into the
# tools folder, once, and are linked in for this step.
sdk="$work/packages/trueforge-sdk"
sdk_tools="$tools_dir/sdk-tests"
sdk_want=$(node -p "const d = require('$sdk/package.json').devDependencies;
  ['vitest', 'msw', 'typescript', '@types/node', '@biomejs/biome'].map((n) => n + '@' + d[n]).join(' ')")
if [ "$(cat "$sdk_tools/.installed" 2>/dev/null)" != "$sdk_want" ]; then
  rm -rf "$sdk_tools" && mkdir -p "$sdk_tools"
  # shellcheck disable=SC2086 # a list of package specs
  (cd "$sdk_tools" && echo '{"private":true}' >package.json && npm install --no-audit --no-fund --silent $sdk_want &&
    echo "$sdk_want" >.installed) >"$logs/sdk-tools.log" 2>&1 || true
fi
if [ -f "$sdk_tools/.installed" ]; then
  ln -sfn "$sdk_tools/node_modules" "$sdk/node_modules"
  NO_COLOR=1 step "SDK tests: trueforge-sdk (vitest, wire and unit)" \
    bash -c 'cd packages/trueforge-sdk && node_modules/.bin/vitest run'
  sdk_counts="$(grep -E '^ +Test Files' "$step_log" | tail -n 1 | sed -E 's/^ +Test Files +/files: /'); $(grep -E '^ +Tests ' "$step_log" | tail -n 1 | sed -E 's/^ +Tests +/tests: /')"
  note "SDK tests (vitest, $sdk_want): $sdk_counts (${step_secs}s)"
  say "$sdk_counts"
  # The SDK's own formatter over the whole package (the series' hand-written files included).
  step "SDK format: trueforge-sdk (its format:check, biome)" \
    bash -c 'cd packages/trueforge-sdk && node_modules/.bin/biome format --skip-parse-errors --no-errors-on-unmatched --max-diagnostics=none .'
  sdk_format=$(grep -E '^Checked [0-9]+ files' "$step_log" | tail -n 1 | sed -E 's/ in [0-9.]+m?s\././')
  note "SDK format (biome, its biome.json): $sdk_format (${step_secs}s)"
  say "SDK format: $sdk_format"
  rm -f "$sdk/node_modules"
else
  sdk_skipped="the SDK's vitest tests: could not install $sdk_want (log $logs/sdk-tools.log)"
fi

# The settings UI (packages/trueforge-ui, outside the workspace): its locked dependencies are not
# served, so the UI files of the series are type-checked and tested against the public source of
# the runtime they need (integrations/trueforge/ui-check/run.mjs), when $TRUEFORGE_UI_RUNTIME names a
# checkout of it at the locked tag.
if [ -n "${TRUEFORGE_UI_RUNTIME:-}" ]; then
  step "UI: trueforge-ui type check, vitest and eslint, against the runtime's source" \
    "$node22" "$root/integrations/trueforge/ui-check/run.mjs" --trueforge "$work" \
    --runtime "$TRUEFORGE_UI_RUNTIME" --tools "$tools_dir/ui-check" --report "$logs/ui-check.json"
  ui_counts=$("$node22" -e '
    const r = require(process.argv[1]); const t = r.typecheck
    const causes = Object.entries(t.elsewhere_by_cause).map(([k, v]) => `${k} ${v}`).join(", ")
    console.log(`runtime ${r.runtime}; tsc: ${t.files - 1} series files + a canary, ${t.errors_in_series_files} errors in them, ` +
      `${t.errors_elsewhere} elsewhere in the package (${causes || "none"}); vitest: ${r.tests.test_files} files, ${r.tests.tests} tests; ` +
      `eslint (its config): ${r.lint.files} files, ${r.lint.errors} errors, ${r.lint.warnings} warnings`)' "$logs/ui-check.json")
  note "UI (trueforge-ui): $ui_counts (${step_secs}s)"
  say "$ui_counts"
else
  ui_skipped="trueforge-ui type check, vitest and eslint: set TRUEFORGE_UI_RUNTIME to a checkout of truefoundry/truefoundry-agents-assistant-ui-runtime at v0.1.21 (integrations/trueforge/README.md); the UI packages cannot be installed as locked"
fi

printf '\n==> lint: eslint packages/trueforge-core packages/trueforge\n'
t0=$SECONDS
set +e
(cd "$work" && node_modules/.bin/eslint packages/trueforge-core packages/trueforge --format json \
  --output-file "$logs/eslint.json") >"$logs/eslint.log" 2>&1
set -e
[ -s "$logs/eslint.json" ] || {
  cat "$logs/eslint.log"
  fail "eslint wrote no report"
}
lint_line=$("$node22" - "$logs/eslint.json" "$root/integrations/trueforge/lint-baseline.txt" "$work" <<'EOF'
const fs = require('node:fs')
const [report, baselineFile, work] = process.argv.slice(2)
const results = JSON.parse(fs.readFileSync(report, 'utf8'))
const known = new Map()
for (const line of fs.readFileSync(baselineFile, 'utf8').split('\n')) {
  const t = line.replace(/#.*/, '').trim()
  if (t) known.set(t, false)
}
let errors = 0, warnings = 0
const fresh = []
for (const r of results) {
  warnings += r.warningCount
  for (const m of r.messages) {
    if (m.severity !== 2) continue
    errors++
    const key = `${r.filePath.slice(work.length + 1)} ${m.ruleId}`
    if (known.has(key)) known.set(key, true)
    else fresh.push(`${key}:${m.line}:${m.column} ${m.message}`)
  }
}
const baseline = [...known.values()].filter(Boolean).length
if (fresh.length > 0) {
  console.error(fresh.join('\n'))
  console.log(`FAIL ${fresh.length} new error(s)`)
  process.exit(1)
}
console.log(`${results.length} files, ${errors} error(s) all on the untouched tree (lint-baseline.txt: ${baseline}), ${warnings} warning(s), 0 new`)
EOF
) || fail "eslint reported errors the untouched tree does not have (above)"
note "lint (eslint, core + server): $lint_line ($((SECONDS - t0))s)"
say "lint: $lint_line"

step "format: pnpm format:check (prettier, whole repository)" pnpm run format:check
# The files it covered: its patterns over the tree, less what its ignore files exclude.
format_files=$(cd "$work" && git ls-files -- '*.js' '*.jsx' '*.ts' '*.tsx' '*.json' '*.md' | "$node22" -e '
  const prettier = require(require.resolve("prettier", { paths: [process.cwd()] }))
  const files = require("node:fs").readFileSync(0, "utf8").split("\n").filter(Boolean)
  Promise.all(files.map((f) => prettier.getFileInfo(f, { ignorePath: [".gitignore", ".prettierignore"] })))
    .then((infos) => console.log(infos.filter((i) => !i.ignored && i.inferredParser).length))')
note "format (prettier, whole repository): $format_files files, all formatted (${step_secs}s)"
say "format: $format_files files checked, all formatted"

step "unit tests: trueforge-core" pnpm --filter @truefoundry/trueforge-core test
note "unit trueforge-core: $(jest_counts "$step_log") (${step_secs}s)"
say "$(jest_counts "$step_log")"
step "unit tests: trueforge" pnpm --filter @truefoundry/trueforge test
note "unit trueforge: $(jest_counts "$step_log") (${step_secs}s)"
say "$(jest_counts "$step_log")"
step "store contract suites: trueforge on SQLite (pnpm test:store:sqlite)" pnpm test:store:sqlite
note "store contract (SQLite): $(jest_counts "$step_log") (${step_secs}s)"
say "$(jest_counts "$step_log")"

# --- 4. the opt-in suites of the series
export TRUEFORGE_DOCKER_SANDBOX_IMAGE=$image
TRUEFORGE_DOCKER_SANDBOX_NAMESPACE="tfc-$tag" step "pnpm test:docker-sandbox:contract" pnpm test:docker-sandbox:contract
note "test:docker-sandbox:contract: $(jest_counts "$step_log") (${step_secs}s)"
say "$(jest_counts "$step_log")"
TRUEFORGE_DOCKER_SANDBOX_NAMESPACE="tfg-$tag" step "pnpm test:docker-sandbox:gpu" pnpm test:docker-sandbox:gpu
# Its first sentence: OK, or SKIPPED with the reason.
gpu_line=$(grep -E '^test:docker-sandbox:gpu: (SKIPPED|OK)' "$step_log" | head -n 1 | sed -E 's/^([^.]*\.).*/\1/')
[ -n "$gpu_line" ] || fail "test:docker-sandbox:gpu printed neither OK nor SKIPPED (log $step_log)"
note "test:docker-sandbox:gpu: ${gpu_line#test:docker-sandbox:gpu: } (${step_secs}s)"
say "$gpu_line"

# --- 5. our tests of TrueForge's Sandbox class, inside the patched tree
tests_rel="tests/docker-sandbox-$tag"
mkdir -p "$work/packages/trueforge-core/$tests_rel"
cp "$root"/__test__/trueforge/*.ts "$work/packages/trueforge-core/$tests_rel/"
ln -sfn ../../trueforge/node_modules/trueforge-docker-sandbox "$work/packages/trueforge-core/node_modules/trueforge-docker-sandbox"
TRUEFORGE_SANDBOX_IMAGE=$image step "our tests of TrueForge's Sandbox class over the provider (__test__/trueforge)" \
  bash -c "cd packages/trueforge-core && node_modules/.bin/jest --config jest.config.cjs --runInBand '$tests_rel/'"
# Out again before the build, which type-checks everything under tests/.
rm -rf "$work/packages/trueforge-core/$tests_rel" "$work/packages/trueforge-core/node_modules/trueforge-docker-sandbox"
note "Sandbox-class and Code Mode tests (__test__/trueforge): $(jest_counts "$step_log") (${step_secs}s)"
say "$(jest_counts "$step_log")"

# --- 6. end to end: the standalone server
step "build trueforge-core and the server (for pnpm standalone:start)" \
  bash -c 'pnpm --filter @truefoundry/trueforge-core build && pnpm --filter @truefoundry/trueforge build'
note "build core + server: ${step_secs}s"
printf '\n==> end to end: standalone server, docker provider, stub model and MCP server on loopback\n'
t0=$SECONDS
"$node22" "$root/integrations/trueforge/e2e/run.mjs" --trueforge "$work" --image "$image" \
  --namespace "tfe2e-$tag" --report "$logs/e2e.json" || fail "end-to-end run (above)"
e2e=$("$node22" -e '
  const r = require(process.argv[1]); const t = r.timings
  console.log(`server start ${t.server_start_ms} ms, PUT->ready ${t.put_to_ready_ms} ms, first turn ${t.first_turn_ms} ms, ` +
    `later turns ${t.later_turns_ms.join("/")} ms, Code Mode turn ${t.code_mode_turn_ms} ms, ` +
    `egress turns ${(t.egress_turns_ms ?? ["-"]).join("/")} ms; ${r.steps.length} steps, ${r.model_requests} model requests`)' "$logs/e2e.json")
note "end to end: $e2e ($((SECONDS - t0))s)"

# --- what cannot run here
skipped=(
  "installing trueforge-ui and frontend, and frontend's checks: their locked @assistant-ui/core 0.2.22 and @truefoundry/assistant-ui-runtime 0.1.21 are not served by the registry, so they stay out of the workspace (the series does not change frontend)"
  "SDK generation (Fern, pnpm sdk:generate): the generator runs from a Docker image on Docker Hub and needs the Fern CLI's network access; patch 6's SDK files are hand-written stand-ins (marked so) to the regenerated OpenAPI, type-checked and tested above, which TrueForge's Generate SDK workflow replaces"
  "store contract suites on Postgres (pnpm test:store:postgres): need a Postgres server"
)
[ -z "${ui_skipped:-}" ] || skipped+=("$ui_skipped")
[ -z "${sdk_skipped:-}" ] || skipped+=("$sdk_skipped")
if command -v helm >/dev/null 2>&1; then
  step "helm lint + template (dockerSandbox values)" bash -c \
    'helm lint charts/trueforge --values charts/trueforge/ci/lint-values.yaml && helm template t charts/trueforge --values charts/trueforge/ci/lint-values.yaml --set dockerSandbox.socketHostPath=/var/run/docker.sock,dockerSandbox.host=tcp://engine:2376 >/dev/null'
  note "helm lint + template: ok (${step_secs}s)"
else
  skipped+=("helm lint/template of the chart changes (patch 7): no helm here")
fi
if docker compose version >/dev/null 2>&1; then
  step "docker compose config (with the docker-sandbox override)" \
    bash -c 'touch packages/trueforge/.env && docker compose -f docker-compose.yml -f docker-compose.docker-sandbox.yml config -q'
  note "docker compose config with the override: ok"
else
  skipped+=("docker compose config of the override (patch 7): no compose plugin here")
fi

printf '\n==> Summary (%ss in all)\n' "$((SECONDS - t_all))"
for line in "${summary[@]}"; do say "  ok      $line"; done
for line in "${skipped[@]}"; do say "  skipped $line"; done
say "OK"
