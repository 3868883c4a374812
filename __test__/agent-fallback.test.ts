// A sandbox whose agent cannot start or keep running is still made and served (issue 32, item 2):
// its calls take the engine's exec and archive endpoints, one logger warning per sandbox and
// reason says so, and agentStatus says why. Each failure is forced for real: agents that the
// runtime cannot execute, that exit at once, that answer garbage, or that die right after their
// hello (__test__/fixtures/fake-agents.ts, given to the provider through
// TRUEFORGE_AGENT_BIN_DIR), and the real agent killed again and again by a root workload. The
// gVisor case runs in __test__/engines/gvisor.test.ts.

import { execFileSync, spawnSync } from 'node:child_process'
import { rmSync } from 'node:fs'
import path from 'node:path'

import { DockerSandboxProvider } from '..'
import { fakeAgentDir, removeFakeAgentVolume, type FakeAgent } from './fixtures/fake-agents'
import {
  BUSYBOX,
  SandboxTracker,
  containerNameFor,
  docker,
  ok,
  onRunsc,
  uniqueNamespace,
  waitFor,
  type Provider,
} from './helpers'

jest.setTimeout(120_000)

const namespace = uniqueNamespace('t-agentfb')
const tracker = new SandboxTracker(namespace)
const providers: Provider[] = []
const dirs: string[] = []
const version = execFileSync(path.join(__dirname, '..', 'agent-bin', 'trueforge-agent-x86_64'), ['--version'], {
  encoding: 'utf8',
})
  .trim()
  .split(' ')[1]
// The fake agents are x86_64 code.
const x64 = process.arch === 'x64'

type Warning = { message: string; meta: any }

function provider(warnings: Warning[], agentDir?: string): Provider {
  const logger = {
    debug() {},
    info() {},
    error() {},
    warn: (message: string, meta: any) => warnings.push({ message, meta }),
  }
  if (agentDir) process.env.TRUEFORGE_AGENT_BIN_DIR = agentDir
  try {
    const p = new DockerSandboxProvider({ image: BUSYBOX, namespace, network: 'none', logger } as any)
    providers.push(p)
    return p
  } finally {
    delete process.env.TRUEFORGE_AGENT_BIN_DIR
  }
}

afterAll(async () => {
  await tracker.cleanup(providers[0])
  for (const p of providers) await p.dispose()
  for (const d of dirs) {
    removeFakeAgentVolume(d, version)
    rmSync(d, { recursive: true, force: true })
  }
})

/** The sandbox answers commands and files, whatever serves them. */
async function served(p: Provider, id: string): Promise<void> {
  expect(await ok(p, id, 'echo works; id -u')).toBe('works\n0\n')
  await p.uploadFile({ sandboxId: id, remotePath: 'up.txt', content: Buffer.from('uploaded') })
  expect(String(await p.downloadFile({ sandboxId: id, path: 'up.txt' }))).toBe('uploaded')
  expect(await ok(p, id, 'cat up.txt')).toBe('uploaded')
}

const cases: Array<[FakeAgent, string, RegExp]> = [
  ['unexecutable', 'the runtime cannot execute', /exec format error/],
  ['exits', 'exits at once', /giving up at once/],
  ['garbage', 'answers garbage', /this is not a hello frame/],
  ['dies-after-hello', 'dies right after its hello', /died while it laid out the new sandbox/],
]

describe.each(cases)('an agent binary that %s', (kind, _what, reason) => {
  const run = x64 ? test : test.skip
  run('createSandbox works; calls take the engine endpoints; agentStatus and one warning say why', async () => {
    const dir = fakeAgentDir(kind, version)
    dirs.push(dir)
    const warnings: Warning[] = []
    const p = provider(warnings, dir)
    const id = await tracker.create(p)
    await served(p, id)
    await served(p, id)
    expect(await p.agentStatus(id)).toEqual({ mode: 'engine-exec', reason: expect.stringMatching(reason) })
    expect(warnings).toEqual([
      {
        message: expect.stringMatching(/commands and files use the engine's exec and archive endpoints/),
        meta: expect.objectContaining({ sandboxId: id, reason: expect.stringMatching(reason), retryInSeconds: 60 }),
      },
    ])
  })
})

test('doctor says why the agent does not serve the test sandbox, and that it still works', () => {
  if (!x64) return console.warn('skipped: the fake agents are x86_64 code')
  const dir = fakeAgentDir('exits', version)
  dirs.push(dir)
  const cli = path.join(__dirname, '..', 'cli', 'index.js')
  const r = spawnSync(
    process.execPath,
    [cli, 'doctor', '--image', BUSYBOX, '--network', 'none', '--namespace', namespace],
    {
      encoding: 'utf8',
      env: { ...process.env, TRUEFORGE_AGENT_BIN_DIR: dir },
      timeout: 60_000,
    },
  )
  expect(r.stdout).toMatch(
    /^warn {2}agent: commands and files use the engine's exec and archive endpoints: .*giving up at once/m,
  )
  expect(r.stdout).toMatch(/tries the agent again a minute later/)
  expect(r.stdout).toMatch(/^ok {4}test sandbox: create \d+ ms, exec \d+ ms/m)
})

test('the real agent killed again and again by a root workload: the calls it was serving fail, later ones take the engine endpoints; a restart of the container tries it again', async () => {
  const warnings: Warning[] = []
  const p = provider(warnings)
  const id = await tracker.create(p)
  expect((await p.agentStatus(id)).mode).toBe('agent')
  const container = containerNameFor(namespace, id)
  // From outside, as root: kill every process named like the agent (its comm) ten times a second.
  docker([
    'exec',
    '-d',
    '-u',
    '0',
    container,
    'sh',
    '-c',
    'while :; do for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = trueforge-agent ] && kill -9 ${d#/proc/}; done; sleep 0.1; done',
  ])
  const results = []
  for (let i = 0; i < 8; i++) results.push(await p.exec({ sandboxId: id, command: 'sleep 1; echo served' }))
  const failed = results.filter((r) => !r.success)
  // The killer also kills a command's supervisor (a fork of the agent, with its name) when it
  // finds that before the agent: the agent lives on and says so; no loss is counted for it.
  const lost = failed.filter((r) => /agent ended while the call was in flight/.test(r.error))
  const supervisorKilled = /its supervisor died before it could report how the command ended/
  for (const r of failed)
    if (!lost.includes(r)) expect(r).toEqual({ success: false, error: expect.stringMatching(supervisorKilled) })
  // At most the calls that counted the losses lost their agent (under gVisor one more: a killed
  // agent there can go silent before its stream ends, and a silent agent is not counted as dead).
  const most = onRunsc ? 4 : 3
  expect({ lost: lost.length, errors: lost.map((r) => r.error) }).toEqual({
    lost: Math.min(lost.length, most),
    errors: expect.anything(),
  })
  expect(lost.length).toBeGreaterThan(0)
  expect(results.slice(-3)).toEqual(Array(3).fill({ success: true, response: { exitCode: 0, result: 'served\n' } }))
  const st = await p.agentStatus(id)
  expect(st).toEqual({ mode: 'engine-exec', reason: expect.stringMatching(/died|ended/) })
  // Besides each failed call's own warning, one says the agent was given up.
  const fallbacks = () => warnings.filter((w) => /engine's exec and archive endpoints/.test(w.message))
  expect(fallbacks()).toEqual([
    { message: expect.stringMatching(/keeps dying|cannot run here/), meta: expect.objectContaining({ sandboxId: id }) },
  ])
  // Files too take the engine's endpoints, without a failure.
  await served(p, id)
  // A stopped container (which takes the killer with it), started again by the next call: the
  // agent serves again, and no second warning is given.
  docker(['stop', '-t', '1', container])
  expect(await ok(p, id, 'echo restarted')).toBe('restarted\n')
  await waitFor(
    async () => (await p.agentStatus(id)).mode === 'agent',
    20_000,
    'the agent to serve the restarted sandbox',
  )
  expect(fallbacks()).toHaveLength(1)
})
