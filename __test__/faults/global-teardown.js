'use strict'

// Finds anything this run left on either engine (counted as leaked, then removed), tears the
// fault engine down, and prints and writes the summary (test-results/faults.json).
const { execFileSync, spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const { ENGINE_SCRIPT, FAULT_HOST, MAIN_HOST, PARTS_DIR, RESULTS_DIR, SUMMARY_FILE, runPrefix } = require('./paths')

function docker(host, args) {
  const r = spawnSync('docker', ['-H', host, ...args], { encoding: 'utf8', timeout: 60000 })
  return { status: r.status ?? -1, stdout: (r.stdout ?? '').trim(), stderr: (r.stderr ?? '').trim() }
}

/** Containers of this run on `host`: by namespace label, test label or name prefix. */
function leftovers(host) {
  const prefix = runPrefix()
  const r = docker(host, [
    'ps',
    '-a',
    '--format',
    '{{.ID}}\t{{.Names}}\t{{.Label "trueforge.sandbox.namespace"}}\t{{.Label "trueforge-test.namespace"}}',
  ])
  if (r.status !== 0) return { error: r.stderr, found: [] }
  const found = []
  for (const line of r.stdout.split('\n')) {
    if (!line.trim()) continue
    const [id, name, ns, testNs] = line.split('\t')
    if ([name, ns, testNs].some((v) => v && (v.startsWith(prefix) || v.startsWith(`trueforge-${prefix}`)))) {
      found.push({ id, name })
    }
  }
  return { found }
}

function readParts() {
  const parts = []
  let jest = null
  let run = null
  if (!fs.existsSync(PARTS_DIR)) return { parts, jest, run }
  for (const f of fs.readdirSync(PARTS_DIR).sort()) {
    const data = JSON.parse(fs.readFileSync(path.join(PARTS_DIR, f), 'utf8'))
    if (f === 'jest.json') jest = data
    else if (f === 'run.json') run = data
    else parts.push(data)
  }
  return { parts, jest, run }
}

module.exports = async function globalTeardown() {
  // A file that died mid-fault may have left the engine frozen: thaw it so cleanup can run.
  spawnSync('bash', [ENGINE_SCRIPT, 'resume'], { stdio: 'ignore' })

  const left = {}
  for (const [label, host] of [
    ['fault', FAULT_HOST],
    ['main', MAIN_HOST],
  ]) {
    const { found, error } = leftovers(host)
    left[label] = found.map((c) => c.name)
    if (error && label === 'main') console.warn(`[faults] could not list the main engine's containers: ${error}`)
    if (found.length > 0) docker(host, ['rm', '-f', '-v', ...found.map((c) => c.id)])
  }

  execFileSync('bash', [ENGINE_SCRIPT, 'teardown'], { stdio: ['ignore', 'inherit', 'inherit'], timeout: 120000 })
  const status = spawnSync('bash', [ENGINE_SCRIPT, 'status'], { encoding: 'utf8' })
  const faultEngineStopped = status.status === 3
  const mainLeft = leftovers(MAIN_HOST).found.length

  const { parts, jest, run } = readParts()
  const sum = (f) => parts.reduce((n, p) => n + (f(p) || 0), 0)
  const faults = {}
  for (const p of parts) for (const [k, v] of Object.entries(p.faults || {})) faults[k] = (faults[k] || 0) + v
  const leakedByFiles = parts.flatMap((p) => p.leaked || [])
  const leftAtTeardown = [...left.fault, ...left.main]
  const memory = parts.map((p) => p.memoryGrowthMiB).find((m) => typeof m === 'number')
  const summary = {
    finishedAt: new Date().toISOString(),
    durationSeconds: run ? Math.round((Date.now() - run.startedAt) / 100) / 10 : null,
    tests: jest,
    callsMade: sum((p) => p.calls),
    callsSucceeded: sum((p) => p.succeeded),
    callsSettledWithClearError: sum((p) => p.clearErrors),
    callsLost: sum((p) => p.lost),
    lostCalls: parts.flatMap((p) => (p.lostCalls || []).map((c) => ({ file: p.file, ...c }))),
    faultsInjected: Object.values(faults).reduce((a, b) => a + b, 0),
    faultsByKind: faults,
    containersLeaked: leakedByFiles.length + leftAtTeardown.length,
    containersLeakedDetail: { leftByProvider: leakedByFiles, leftAtTeardown },
    memoryGrowthMiB: memory ?? null,
    unhandledRejections: parts.flatMap((p) => p.unhandled || []),
    faultEngineStopped,
    leftOnMainEngine: mainLeft,
    perFile: parts.map((p) => ({
      file: p.file,
      calls: p.calls,
      succeeded: p.succeeded,
      clearErrors: p.clearErrors,
      lost: p.lost,
      faults: p.faults,
      leaked: (p.leaked || []).length,
    })),
  }
  fs.mkdirSync(RESULTS_DIR, { recursive: true })
  fs.writeFileSync(SUMMARY_FILE, `${JSON.stringify(summary, null, 2)}\n`)
  fs.rmSync(PARTS_DIR, { recursive: true, force: true })

  const t = jest
    ? `${jest.numPassedTests} passed, ${jest.numFailedTests} failed, ${jest.numTotalTests} total`
    : 'unknown'
  const lines = [
    '',
    '==================== fault suite summary ====================',
    `tests:                 ${t}`,
    `calls made:            ${summary.callsMade} (succeeded ${summary.callsSucceeded}, clear errors ${summary.callsSettledWithClearError})`,
    `calls lost:            ${summary.callsLost}`,
    `faults injected:       ${summary.faultsInjected} ${JSON.stringify(faults)}`,
    `containers leaked:     ${summary.containersLeaked}` +
      (summary.containersLeaked ? ` ${JSON.stringify(summary.containersLeakedDetail)}` : ''),
    `memory growth (1 GiB): ${memory === undefined ? 'not measured' : `${memory} MiB`}`,
    `unhandled rejections:  ${summary.unhandledRejections.length}`,
    `fault engine stopped:  ${faultEngineStopped}; left on main engine: ${mainLeft}`,
    `duration:              ${summary.durationSeconds} s`,
    `written to:            ${path.relative(process.cwd(), SUMMARY_FILE) || SUMMARY_FILE}`,
  ]
  if (jest && jest.failed.length) lines.push('failed:', ...jest.failed.map((f) => `  - ${f}`))
  for (const c of summary.lostCalls) lines.push(`lost: ${c.file} ${c.kind}: ${c.reason}`)
  lines.push('=============================================================', '')
  process.stdout.write(`${lines.join('\n')}\n`)
}
