// End-to-end run of a TrueForge server (standalone, SQLite) with the Docker sandbox provider.
//
//   node run.mjs --trueforge <dir> --image <image> --namespace <ns> --report <file.json>
//
// <dir> is a TrueForge work tree with the patch series applied, installed, and trueforge-core and
// the server built. Everything talks over 127.0.0.1: the server, a stub OpenAI-compatible model
// (stub-model.mjs) registered as a `custom` model provider, and a stub MCP server (stub-mcp.mjs).
// Each step prints one line with its figures; the report file gets the same as JSON. Every
// container of the namespace is removed at the end, whatever happens, and the server is stopped.

import { execFile, spawn } from 'node:child_process'
import { randomBytes, createHash } from 'node:crypto'
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { createServer as createHttpServer } from 'node:http'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { startStubMcp } from './stub-mcp.mjs'
import { startStubModel } from './stub-model.mjs'

const run = promisify(execFile)

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`)
  if (i !== -1 && process.argv[i + 1] !== undefined) return process.argv[i + 1]
  if (fallback !== undefined) return fallback
  throw new Error(`--${name} is required`)
}

const tfDir = arg('trueforge')
const image = arg('image', 'trueforge-sandbox:2')
const namespace = arg('namespace')
const reportFile = arg('report', '')
const NAMESPACE_LABEL = 'trueforge.sandbox.namespace'
const ID_LABEL = 'trueforge.sandbox.id'

const report = { steps: [], timings: {}, ok: false }
const say = (line) => console.log(`e2e: ${line}`)
function step(name, figures) {
  report.steps.push({ name, ...figures })
  const parts = Object.entries(figures).map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
  say(`${name}: ${parts.join(' ')}`)
}
function check(condition, message) {
  if (!condition) throw new Error(message)
}
const ms = (t0) => Date.now() - t0

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** This namespace's sandbox containers: [{ id: container id, sandbox: sandbox id, state }]. */
async function containers() {
  const { stdout } = await run('docker', [
    'ps',
    '-a',
    '--filter',
    `label=${NAMESPACE_LABEL}=${namespace}`,
    '--filter',
    `label=${ID_LABEL}`,
    '--format',
    `{{.ID}}\t{{.Label "${ID_LABEL}"}}\t{{.State}}`,
  ])
  return stdout
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [id, sandbox, state] = line.split('\t')
      return { id, sandbox, state }
    })
}

/** Removes every container of the namespace (ours only: the namespace is this run's). */
async function sweep() {
  const { stdout } = await run('docker', ['ps', '-aq', '--filter', `label=${NAMESPACE_LABEL}=${namespace}`])
  const ids = stdout.split('\n').filter(Boolean)
  if (ids.length > 0) await run('docker', ['rm', '-f', '-v', ...ids]).catch(() => {})
  return ids.length
}

let base
async function api(method, path, body) {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  let json
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: res.status, json, text }
}

function expectStatus(r, status, what) {
  check(r.status === status, `${what}: HTTP ${r.status}, expected ${status}: ${r.text.slice(0, 500)}`)
  return r.json
}

/** JSON with every object's keys in order: the server returns a manifest in its schema's order. */
function canonical(value) {
  const sort = (v) =>
    Array.isArray(v)
      ? v.map(sort)
      : v && typeof v === 'object'
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sort(v[k])]),
          )
        : v
  return JSON.stringify(sort(value))
}

/** Runs one turn (stream: false) and waits for its terminal state. */
async function turn(sessionId, content) {
  const t0 = Date.now()
  const created = expectStatus(
    await api('POST', `/api/v1/sessions/${sessionId}/turns`, {
      input: [{ type: 'user.message', content }],
      stream: false,
    }),
    200,
    'create turn',
  )
  const turnId = created.data.id
  for (;;) {
    const got = expectStatus(await api('GET', `/api/v1/sessions/${sessionId}/turns/${turnId}`), 200, 'get turn')
    const state = got.data.state
    if (state.status !== 'running') {
      check(state.status === 'done', `turn ${turnId} ended ${state.status}: ${state.message ?? ''}`)
      return { turnId, ms: ms(t0), output: state.output, turn: got.data }
    }
    if (Date.now() - t0 > 180_000) throw new Error(`turn ${turnId} still running after 180 s`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

/** The output of the `exec` tool call the stub model made for the last turn (from its second request). */
function lastToolResult(model) {
  const req = [...model.requests].reverse().find((r) => r.messages?.[r.messages.length - 1]?.role === 'tool')
  const content = req?.messages[req.messages.length - 1].content
  return typeof content === 'string' ? content : JSON.stringify(content ?? '')
}

/**
 * Whether the trueforge-docker-sandbox the server has installed takes the `egress` option: its
 * constructor (which reaches no engine) refuses an option it does not know, naming it.
 */
function installedProviderTakesEgress() {
  const require = createRequire(join(tfDir, 'packages/trueforge/package.json'))
  const { DockerSandboxProvider } = require('trueforge-docker-sandbox')
  try {
    new DockerSandboxProvider({ image: 'trueforge-sandbox:2', egress: 'none' }).dispose()
    return true
  } catch (error) {
    if (error?.code === 'INVALID_OPTION' && error.option === 'egress' && /unknown option/.test(error.message)) {
      return false
    }
    throw error
  }
}

let server
let serverExited
async function stopServer() {
  if (!server || server.exitCode !== null) return
  try {
    process.kill(-server.pid, 'SIGTERM')
  } catch {
    return
  }
  const done = await Promise.race([
    serverExited.then(() => true),
    new Promise((r) => setTimeout(() => r(false), 10_000)),
  ])
  if (!done) {
    try {
      process.kill(-server.pid, 'SIGKILL')
    } catch {
      // already gone
    }
  }
}

async function main() {
  const scratch = mkdtempSync(join(tmpdir(), 'tf-e2e-'))
  const serverLog = join(scratch, 'server.log')
  const model = await startStubModel()
  const mcp = await startStubMcp()
  const envFile = join(tfDir, 'packages/trueforge/.env')
  const hadEnv = existsSync(envFile) ? readFileSync(envFile) : undefined
  try {
    // --- server start
    const port = await freePort()
    base = `http://127.0.0.1:${port}`
    writeFileSync(
      envFile,
      [
        `PORT=${port}`,
        'HOST=127.0.0.1',
        'STANDALONE=true',
        `SQLITE_PATH=${join(scratch, 'db.sqlite')}`,
        `XDG_DATA_HOME=${join(scratch, 'xdg')}`,
        '',
      ].join('\n'),
    )
    const t0 = Date.now()
    const log = openSync(serverLog, 'a')
    server = spawn('pnpm', ['standalone:start'], { cwd: tfDir, detached: true, stdio: ['ignore', log, log] })
    serverExited = new Promise((r) => server.once('exit', r))
    for (;;) {
      if (server.exitCode !== null) throw new Error(`server exited (${server.exitCode}); log: ${serverLog}`)
      const ok = await fetch(`${base}/healthz`).then(
        (r) => r.ok,
        () => false,
      )
      if (ok) break
      if (ms(t0) > 60_000) throw new Error(`server not healthy after 60 s; log: ${serverLog}`)
      await new Promise((r) => setTimeout(r, 100))
    }
    report.timings.server_start_ms = ms(t0)
    step('server started (pnpm standalone:start, SQLite)', { ms: report.timings.server_start_ms, port })

    // --- settings: the docker provider, the stub model, the stub MCP server
    const catalog = expectStatus(await api('GET', '/api/v1/catalogs/sandbox-providers'), 200, 'sandbox catalog')
    const preset = catalog.data.find((p) => p.type === 'docker')
    check(preset !== undefined, 'the sandbox catalog has no docker preset')
    check(Array.isArray(preset.egress?.allow), 'the docker preset has no egress allow-list')
    // The preset's egress allow-list needs a trueforge-docker-sandbox with the `egress` option; an
    // installed one without it refuses the field (a 400), so the run then saves the preset without
    // it and says so.
    const egressOption = installedProviderTakesEgress()
    const { egress: presetEgress, ...presetWithoutEgress } = preset
    const manifest = { ...(egressOption ? preset : presetWithoutEgress), image, namespace, exec_timeout_ms: 120_000 }
    report.egress = egressOption
      ? { preset: 'saved with the preset allow-list', allow: presetEgress.allow.length }
      : { preset: 'saved without egress: the installed trueforge-docker-sandbox has no egress option' }
    const tPut = Date.now()
    const put = expectStatus(
      await api('PUT', '/api/v1/settings/sandbox-providers', { manifest }),
      200,
      'PUT sandbox provider',
    )
    check(
      canonical(put.data.manifest) === canonical(manifest),
      `PUT did not return the manifest as sent: ${canonical(put.data.manifest)} against ${canonical(manifest)}`,
    )
    let status = put.data.status
    let polls = 0
    while (status !== 'ready') {
      check(status !== 'failed', `sandbox provider failed: ${put.data.status_reason}`)
      if (ms(tPut) > 120_000) throw new Error('sandbox provider not ready after 120 s')
      await new Promise((r) => setTimeout(r, 200))
      const got = expectStatus(await api('GET', '/api/v1/settings/sandbox-providers'), 200, 'GET sandbox provider')
      status = got.data.status
      polls++
    }
    report.timings.put_to_ready_ms = ms(tPut)
    step('docker provider saved (PUT) and ready (GET)', {
      ms: report.timings.put_to_ready_ms,
      put_status: put.data.status,
      get_polls: polls,
      image,
      namespace,
      egress: egressOption ? `preset allow-list (${presetEgress.allow.length} entries)` : 'left out (no egress option)',
    })

    expectStatus(
      await api('POST', '/api/v1/settings/model-providers', {
        manifest: {
          type: 'custom',
          name: 'stub',
          base_url: model.url,
          models: [{ model_id: 'stub-model', name: 'stub-model', properties: {} }],
        },
      }),
      201,
      'create model provider',
    )
    expectStatus(
      await api('POST', '/api/v1/settings/mcp-servers', {
        manifest: { type: 'remote', name: 'stubmcp', url: mcp.url, description: 'Upper-cases text (test stub).' },
      }),
      201,
      'create MCP server',
    )
    step('model provider (custom, stub on loopback) and MCP server (stub on loopback) configured', {
      model: model.url,
      mcp: mcp.url,
    })

    const spec = (extra = {}) => ({
      model: { name: 'stub/stub-model' },
      instructions: 'Run what the user asks in the sandbox.',
      config: { sandbox: { enabled: true, file_downloads: true } },
      ...extra,
    })
    const session = expectStatus(await api('POST', '/api/v1/sessions', { agent: { spec: spec() } }), 201, 'session')
    const sessionId = session.data.id
    step('session created', { session: sessionId })

    // --- first turn: a container of the namespace
    const marker = randomBytes(6).toString('hex')
    const t1 = await turn(sessionId, `RUN: echo "exec-${marker}" && pwd && cat /etc/hostname && echo one > note.txt`)
    const out1 = lastToolResult(model)
    check(out1.includes(`exec-${marker}`), `first turn: exec output lacks the marker: ${out1.slice(0, 300)}`)
    check(
      t1.output?.content?.includes?.('DONE') ?? JSON.stringify(t1.output).includes('DONE'),
      'first turn: no final text',
    )
    const c1 = await containers()
    check(c1.length === 1, `first turn: expected 1 container in ${namespace}, found ${c1.length}`)
    check(out1.includes(c1[0].sandbox), `first turn: pwd is not the sandbox id ${c1[0].sandbox}`)
    report.timings.first_turn_ms = t1.ms
    step('turn 1: model called exec, ran in a new container of the namespace', {
      ms: t1.ms,
      containers: c1.length,
      container: c1[0].id,
      sandbox: c1[0].sandbox,
    })

    // --- second turn: the same container
    const t2 = await turn(sessionId, 'RUN: cat note.txt && cat /etc/hostname')
    const out2 = lastToolResult(model)
    const c2 = await containers()
    check(out2.includes('one'), `second turn: the file written by turn 1 is gone: ${out2.slice(0, 300)}`)
    check(c2.length === 1 && c2[0].id === c1[0].id, `second turn: container changed: ${JSON.stringify(c2)}`)
    report.timings.later_turns_ms = [t2.ms]
    step('turn 2: same container reused (file from turn 1 read back)', {
      ms: t2.ms,
      containers: c2.length,
      container: c2[0].id,
    })

    // --- docker rm -f, then the next turn recreates it
    await run('docker', ['rm', '-f', '-v', c2[0].id])
    const gone = await containers()
    check(gone.length === 0, 'docker rm -f left a container behind')
    const t3 = await turn(sessionId, 'RUN: echo "after-removal-$(cat /etc/hostname)" && ls')
    const out3 = lastToolResult(model)
    const c3 = await containers()
    check(out3.includes('after-removal-'), `third turn: exec did not run: ${out3.slice(0, 300)}`)
    check(c3.length === 1 && c3[0].id !== c1[0].id, `third turn: expected one new container: ${JSON.stringify(c3)}`)
    report.timings.later_turns_ms.push(t3.ms)
    step('turn 3: after `docker rm -f` the sandbox was recreated', {
      ms: t3.ms,
      removed: c2[0].id,
      containers: c3.length,
      container: c3[0].id,
      sandbox: c3[0].sandbox,
    })

    // --- upload through the session API, byte-exact download through the sandbox-file route
    const payload = randomBytes(256 * 1024 + 7)
    const sha = createHash('sha256').update(payload).digest('hex')
    const t4 = await turn(sessionId, [
      { type: 'text', text: 'RUN: sha256sum /trueforge/uploads/payload.bin' },
      { type: 'file', name: 'payload.bin', data: `data:application/octet-stream;base64,${payload.toString('base64')}` },
    ])
    const out4 = lastToolResult(model)
    check(out4.includes(sha), `upload: the sandbox sees other bytes: ${out4.slice(0, 300)}`)
    report.timings.later_turns_ms.push(t4.ms)
    const dl = await fetch(
      `${base}/api/v1/sessions/${sessionId}/turns/${t4.turnId}/download-sandbox-file?path=${encodeURIComponent('/trueforge/uploads/payload.bin')}`,
    )
    const bytes = Buffer.from(await dl.arrayBuffer())
    check(dl.status === 200, `download: HTTP ${dl.status}: ${bytes.toString('utf8', 0, 300)}`)
    check(bytes.equals(payload), `download: ${bytes.length} bytes differ from the ${payload.length} uploaded`)
    const missing = await fetch(
      `${base}/api/v1/sessions/${sessionId}/turns/${t4.turnId}/download-sandbox-file?path=${encodeURIComponent('/trueforge/uploads/no-such-file.bin')}`,
    )
    const missingBody = await missing.text()
    check(missing.status === 404, `missing file: HTTP ${missing.status}, expected 404: ${missingBody.slice(0, 200)}`)
    step('turn 4: file uploaded with the turn, downloaded byte-exact; a missing path is 404', {
      ms: t4.ms,
      bytes: payload.length,
      sha256: sha.slice(0, 16),
      download_status: dl.status,
      missing_status: missing.status,
    })

    // --- Code Mode: the stub MCP tool called with mcp-client from inside the sandbox
    const cmSession = expectStatus(
      await api('POST', '/api/v1/sessions', { agent: { spec: spec({ mcp_servers: [{ name: 'stubmcp' }] }) } }),
      201,
      'Code Mode session',
    )
    const word = `code-mode-${marker}`
    const callsBefore = mcp.calls.length
    const t5 = await turn(cmSession.data.id, `RUN: mcp-client call-tool stubmcp shout '{"text": "${word}"}'`)
    const out5 = lastToolResult(model)
    check(out5.includes(word.toUpperCase()), `Code Mode: the tool result is missing: ${out5.slice(0, 400)}`)
    check(
      mcp.calls.length === callsBefore + 1,
      `Code Mode: the stub MCP server saw ${mcp.calls.length - callsBefore} calls`,
    )
    const c5 = await containers()
    report.timings.code_mode_turn_ms = t5.ms
    step('turn 5 (Code Mode): `mcp-client call-tool` in the sandbox reached the stub MCP server', {
      ms: t5.ms,
      mcp_calls: mcp.calls.length - callsBefore,
      result: word.toUpperCase(),
      containers: c5.length,
    })

    // --- egress: the provider re-saved with a policy that allows one name, mapped to a server of
    // ours on the loopback (the proxy connects from this host); a new session's sandbox has it.
    if (egressOption) {
      const seen = []
      const pkg = createHttpServer((req, res) => {
        seen.push(req.url)
        res.end(`pkg-${marker}\n`)
      })
      await new Promise((resolve) => pkg.listen(0, '127.0.0.1', resolve))
      const pkgPort = pkg.address().port
      try {
        const allowed = `pkg.e2e.test:${pkgPort}`
        const egress = { allow: [allowed], hosts: { 'pkg.e2e.test': '127.0.0.1' } }
        const put2 = expectStatus(
          await api('PUT', '/api/v1/settings/sandbox-providers', { manifest: { ...manifest, egress } }),
          200,
          'PUT sandbox provider with an egress policy',
        )
        check(canonical(put2.data.manifest.egress) === canonical(egress), 'PUT did not keep the egress policy')
        const egSession = expectStatus(
          await api('POST', '/api/v1/sessions', { agent: { spec: spec() } }),
          201,
          'egress session',
        )
        const t6 = await turn(egSession.data.id, `RUN: curl -sS --max-time 10 http://${allowed}/ok`)
        const out6 = lastToolResult(model)
        check(out6.includes(`pkg-${marker}`), `egress: the allowed download did not arrive: ${out6.slice(0, 300)}`)
        check(seen.length === 1, `egress: the server saw ${seen.length} requests, expected 1`)
        const t7 = await turn(egSession.data.id, `RUN: curl -sS --max-time 10 http://denied.e2e.test:${pkgPort}/ok`)
        const out7 = lastToolResult(model)
        check(
          out7.includes(`egress to denied.e2e.test:${pkgPort} refused by the sandbox's egress policy`),
          `egress: the refused download did not say why: ${out7.slice(0, 300)}`,
        )
        check(seen.length === 1, `egress: the refused request reached the server (${seen.length} requests)`)
        report.timings.egress_turns_ms = [t6.ms, t7.ms]
        step("turns 6 and 7 (egress): an allowed download works, a refused one fails with the policy's message", {
          ms: [t6.ms, t7.ms],
          allowed,
          server_requests: seen.length,
          refusal: out7.slice(out7.indexOf('egress to'), out7.indexOf('egress to') + 120),
        })
      } finally {
        pkg.close()
      }
    }

    report.model_requests = model.requests.length
    report.ok = true
  } catch (error) {
    report.error = error instanceof Error ? error.message : String(error)
    throw error
  } finally {
    await stopServer()
    const removed = await sweep()
    if (hadEnv === undefined) rmSync(envFile, { force: true })
    else writeFileSync(envFile, hadEnv)
    await model.close()
    await mcp.close()
    step('cleanup: server stopped, namespace swept', { containers_removed: removed })
    if (report.ok) rmSync(scratch, { recursive: true, force: true })
    else say(`server log kept: ${serverLog}`)
    if (reportFile) writeFileSync(reportFile, JSON.stringify(report, null, 2))
  }
}

main().catch((error) => {
  say(`FAILED: ${error.message}`)
  process.exitCode = 1
})
