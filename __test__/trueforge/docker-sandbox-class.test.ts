// TrueForge's real Sandbox class driven over DockerSandboxProvider the way a server turn drives it:
// the exec tool through callTool, user uploads, tool-result dumps, git credentials, a session
// carried to a later turn (fresh provider, existing sandbox id) and a sandbox removed between turns.
// Runs inside a TrueForge checkout (see scripts/ci/test-trueforge.sh); every container it makes is
// removed at the end.

import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { isCallToolResponseResult } from '../../src/core/mcp/IMCPServer'
import { SANDBOX_EXEC_TOOL_NAME, Sandbox } from '../../src/core/sandbox/Sandbox'
import * as sandboxErrors from '../../src/core/sandbox/SandboxErrors'
import { rawSandboxId } from '../../src/core/sandbox/sandboxRef'
import { SkillMounter } from '../../src/core/sandbox/skills/SkillMounter'
import { containersLeft, type DockerProvider, IMAGE, runNamespace, silentLogger, Tracker, turnSandbox } from './support'

jest.setTimeout(180_000)

const namespace = runNamespace('tfs')
const tracker = new Tracker(namespace)

// The host's error module as a whole, as the server passes it.
const hostErrors = sandboxErrors

/** A provider as the server's factory builds one: tenant, the host's error classes, logger, download cap. */
function serverProvider(extra: Record<string, unknown> = {}): DockerProvider {
  const context = {
    tenantName: 'acme',
    errors: hostErrors,
    logger: silentLogger(),
    fileMaxBytesForDownload: 20 * 1024 * 1024,
  }
  return tracker.provider(context, extra)
}

interface ToolCall {
  isError: boolean
  text: string
  sandboxCreated: boolean | undefined
  sessionId: string | undefined
}

/** The exec tool, called as the agent calls it. */
async function agentExec(sandbox: Sandbox, command: string, env?: Record<string, string>): Promise<ToolCall> {
  const r = await sandbox.callTool({
    name: SANDBOX_EXEC_TOOL_NAME,
    arguments: { intent: 'test', command, ...(env ? { env } : {}) },
  })
  if (!isCallToolResponseResult(r)) throw new Error(`expected a tool result, got ${JSON.stringify(r)}`)
  const first = r.result.content[0] as { type: string; text?: string }
  return {
    isError: Boolean(r.result.isError),
    text: first?.text ?? '',
    sandboxCreated: r.sandboxCreated,
    sessionId: r.sandboxInfo?.sandbox_id,
  }
}

/** The exec tool for a command that must run and exit 0; returns its output. */
async function agentOk(sandbox: Sandbox, command: string): Promise<{ out: string; call: ToolCall }> {
  const call = await agentExec(sandbox, command)
  expect(call.isError).toBe(false)
  const parsed = JSON.parse(call.text)
  if (!parsed.success) throw new Error(`exec did not run: ${parsed.error}`)
  if (parsed.response.exitCode !== 0) {
    throw new Error(`exit ${parsed.response.exitCode} from ${JSON.stringify(command)}: ${parsed.response.result}`)
  }
  return { out: parsed.response.result as string, call }
}

const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex')
const q = (s: string): string => `'${s.replace(/'/g, "'\\''")}'`

afterAll(async () => {
  await tracker.cleanup()
  expect(containersLeft(namespace)).toBe(0)
}, 120_000)

test('sandboxes run the configured image, and a turn reports the session id it created', async () => {
  const mark = tracker.created.length
  const { call } = await agentOk(turnSandbox(serverProvider()), 'true')
  const [raw] = tracker.createdSince(mark)
  expect(call.sandboxCreated).toBe(true)
  expect(call.sessionId).toBe(`v1:docker:${raw}`)
  const ids = execFileSync('docker', ['ps', '-q', '--filter', `label=trueforge.sandbox.namespace=${namespace}`], {
    encoding: 'utf8',
  })
    .split('\n')
    .filter(Boolean)
  const images = ids.map((id) =>
    execFileSync('docker', ['inspect', '-f', '{{.Config.Image}}', id], { encoding: 'utf8' }).trim(),
  )
  expect(images).toContain(IMAGE)
  expect(new Set(images)).toEqual(new Set([IMAGE]))
})

describe('session init with skills', () => {
  test('an empty skill set: init runs the git downloader, which records no skills', async () => {
    const provider = serverProvider()
    const sandbox = turnSandbox(provider, { skillMounter: new SkillMounter([]) })
    const call = await agentExec(sandbox, 'echo ready')
    // A downloader that cannot even import (an image with the wrong pydantic) fails init here.
    expect(call.text).not.toMatch(/ImportError|ModuleNotFoundError/)
    expect(call.isError).toBe(false)
    expect(call.sandboxCreated).toBe(true)
    expect(call.sessionId).toMatch(/^v1:docker:\/workspace\/[0-9A-Z]{26}$/)
    expect(JSON.parse(call.text).response.result).toBe('ready\n')

    const raw = rawSandboxId(call.sessionId!)
    const skills = provider.getSkillsDir(raw)
    const downloader = provider.getGitDownloaderPath(raw)
    const { out } = await agentOk(
      sandbox,
      `cat ${q(skills)}/.tfy-skill-downloader-state.json; test ! -w ${q(downloader)} && echo read-only`,
    )
    expect(JSON.parse(out.replace(/read-only\n$/, '')).downloaded_git_skills).toEqual([])
    expect(out).toMatch(/read-only\n$/)
  })

  test('one skill with no network: init fails at git (ls-remote), not at import', async () => {
    // network 'none' makes "no network" certain whatever the host has.
    const provider = serverProvider({ network: 'none' })
    const mark = tracker.created.length
    const sandbox = turnSandbox(provider, {
      skillMounter: new SkillMounter([
        {
          name: 'demo-skill',
          description: 'A skill that cannot be fetched',
          url: 'https://github.com/truefoundry/trueforge-docker-sandbox-absent.git',
          path: 'skills/demo',
          ref: 'main',
        },
      ]),
    })
    const call = await agentExec(sandbox, 'echo should-not-run')
    expect(call.text).not.toMatch(/ImportError|ModuleNotFoundError|Traceback/)
    expect(call.isError).toBe(true)
    expect(call.text).toMatch(/^Sandbox initialization failed: /)
    expect(call.text).toMatch(/git ls-remote failed/)
    expect(call.text).toMatch(/Failed to install 1\/1 git skill/)
    expect(call.text).not.toContain('should-not-run')

    // The sandbox exists (the session keeps its id) and holds no half-installed skill.
    const [raw] = tracker.createdSince(mark)
    expect(call.sessionId).toBe(`v1:docker:${raw}`)
    const r = await provider.exec({ sandboxId: raw, command: `test ! -e ${q(provider.getSkillsDir(raw))}/demo-skill` })
    expect(r).toMatchObject({ success: true, response: { exitCode: 0 } })
  })
})

test("the provider's request errors are the server's classes", async () => {
  const provider = serverProvider()
  const { call } = await agentOk(turnSandbox(provider), 'mkdir -p adir')
  const sandboxId = rawSandboxId(call.sessionId!)
  const missing = await provider.downloadFile({ sandboxId, path: 'nope.txt' }).catch((e: unknown) => e)
  expect(missing).toBeInstanceOf(sandboxErrors.SandboxFileNotFoundError)
  expect(missing).toBeInstanceOf(sandboxErrors.SandboxError)
  const dir = await provider.downloadFile({ sandboxId, path: 'adir' }).catch((e: unknown) => e)
  expect(dir).toBeInstanceOf(sandboxErrors.SandboxPathIsDirectoryError)
  // One the server has no class for: built on its base, with a status it can reply with.
  const nul = await provider.downloadFile({ sandboxId, path: 'a\u0000b' }).catch((e: unknown) => e)
  expect(nul).toBeInstanceOf(sandboxErrors.SandboxError)
  expect(nul).toMatchObject({ statusCode: 400 })
})

describe('uploads', () => {
  test('nested, unicode and binary user files arrive byte for byte where the agent is told', async () => {
    const provider = serverProvider()
    const sandbox = turnSandbox(provider)
    const binary = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(512 * 1024)])
    const files: Array<[string, Buffer]> = [
      ['reports/2026/q3/summary.csv', Buffer.from('a,b\n1,2\n')],
      ['données/résumé — 東京 🚀.txt', Buffer.from('unicode name, unicode body: ✓ ü 東京\n')],
      ['blob.bin', binary],
    ]
    const stored = []
    for (const [fileName, content] of files) {
      stored.push(await sandbox.uploadUserFile({ fileName, content, mime: 'application/octet-stream' }))
    }
    expect(stored[0]!.sandboxCreated?.sandbox_id).toMatch(/^v1:docker:/)
    expect(stored[1]!.sandboxCreated).toBeUndefined()
    const raw = rawSandboxId(stored[0]!.sandboxCreated!.sandbox_id)
    const uploads = provider.getFileUploadsDir(raw)

    for (let i = 0; i < files.length; i++) {
      const [fileName, content] = files[i]!
      expect(stored[i]!.filePath).toBe(`${uploads}/${fileName}`)
      const back = await provider.downloadFile({ sandboxId: raw, path: stored[i]!.filePath })
      expect(Buffer.compare(back, content)).toBe(0)
      // And the agent's own shell sees the same bytes.
      const { out } = await agentOk(sandbox, `sha256sum ${q(stored[i]!.filePath)}`)
      expect(out.split(' ')[0]).toBe(sha256(content))
    }
    // The agent can copy an upload to work on it (the prompt tells it to).
    await agentOk(sandbox, `cp ${q(stored[2]!.filePath)} work.bin && cmp work.bin ${q(stored[2]!.filePath)}`)
  })

  test('concurrent uploads on a fresh session share one sandbox', async () => {
    const provider = serverProvider()
    const sandbox = turnSandbox(provider)
    const mark = tracker.created.length
    const contents = Array.from({ length: 6 }, (_, i) => randomBytes(64 * 1024 + i))
    const stored = await Promise.all(
      contents.map((content, i) =>
        sandbox.uploadUserFile({ fileName: `batch/f${i}.bin`, content, mime: 'application/octet-stream' }),
      ),
    )
    expect(tracker.createdSince(mark)).toHaveLength(1)
    expect(stored.filter((s) => s.sandboxCreated !== undefined)).toHaveLength(1)
    const [raw] = tracker.createdSince(mark)
    for (let i = 0; i < contents.length; i++) {
      const back = await provider.downloadFile({ sandboxId: raw!, path: stored[i]!.filePath })
      expect(sha256(back)).toBe(sha256(contents[i]!))
    }
  })
})

test('a tool-result dump before any exec creates the sandbox and lands in the dump dir', async () => {
  const provider = serverProvider()
  const sandbox = turnSandbox(provider)
  const mark = tracker.created.length
  const big = Buffer.from(JSON.stringify({ rows: Array.from({ length: 2000 }, (_, i) => ({ i, v: `row-${i}` })) }))
  const dumped = await sandbox.writeArtifact({ fileName: 'call_0001.json', content: big })
  expect(tracker.createdSince(mark)).toHaveLength(1)
  expect(dumped.sandboxCreated?.sandbox_id).toMatch(/^v1:docker:/)
  expect(dumped.filePath).toBe(`${provider.getToolResultDumpDir('').replace(/\/+$/, '')}/call_0001.json`)

  const { out, call } = await agentOk(
    sandbox,
    `head -c 200 ${q(dumped.filePath)} && echo && wc -c < ${q(dumped.filePath)}`,
  )
  expect(call.sandboxCreated).toBe(false)
  expect(out.startsWith(big.subarray(0, 200).toString())).toBe(true)
  expect(out.trim().split('\n').pop()).toBe(String(big.length))
  expect(tracker.createdSince(mark)).toHaveLength(1)
})

test('git credentials are written 0600 for the exec user, used by git, and removed on a turn without them', async () => {
  const provider = serverProvider()
  const token = `tok-${randomBytes(6).toString('hex')}`
  const turn1 = turnSandbox(provider, { resolvedGitCredentialsContent: `https://x-access-token:${token}@github.com\n` })
  const { out, call } = await agentOk(turn1, 'true')
  const raw = rawSandboxId(call.sessionId!)
  const creds = provider.getGitCredentialsPath(raw)

  const { out: stat } = await agentOk(turn1, `stat -c '%a %U' ${q(creds)}; id -un`)
  const [mode, owner] = stat.split('\n')[0]!.split(' ')
  expect(mode).toBe('600')
  expect(owner).toBe(stat.split('\n')[1])
  expect(out).toBe('')

  // The exec env points git's credential helper at that file.
  const { out: filled } = await agentOk(turn1, "printf 'protocol=https\\nhost=github.com\\n\\n' | git credential fill")
  expect(filled).toContain(`password=${token}`)

  // A later turn of the same session without credentials clears the file.
  const turn2 = turnSandbox(serverProvider(), {
    existingSandboxId: call.sessionId,
    resolvedGitCredentialsContent: null,
  })
  const after = await agentOk(turn2, `test ! -e ${q(creds)} && echo removed`)
  expect(after.out).toBe('removed\n')
  expect(after.call.sandboxCreated).toBe(false)
  expect(after.call.sessionId).toBe(call.sessionId)
})

test('a later turn reattaches to the session sandbox through a fresh provider', async () => {
  const first = serverProvider()
  const turn1 = turnSandbox(first)
  const { call } = await agentOk(turn1, 'echo carried > note.txt')
  expect(call.sandboxCreated).toBe(true)
  first.dispose()

  const mark = tracker.created.length
  const turn2 = turnSandbox(serverProvider(), { existingSandboxId: call.sessionId })
  const again = await agentOk(turn2, 'cat note.txt && pwd')
  expect(again.out).toBe(`carried\n${rawSandboxId(call.sessionId!)}\n`)
  expect(again.call.sandboxCreated).toBe(false)
  expect(again.call.sessionId).toBe(call.sessionId)
  expect(tracker.createdSince(mark)).toHaveLength(0)
})

describe('a sandbox removed between turns', () => {
  async function removedSession(): Promise<string> {
    const provider = serverProvider()
    const { call } = await agentOk(turnSandbox(provider), 'echo old > old.txt')
    expect(await provider.removeSandbox(rawSandboxId(call.sessionId!))).toBe(true)
    return call.sessionId!
  }

  test("is recreated when the provider throws the host's error class", async () => {
    const gone = await removedSession()
    const mark = tracker.created.length
    const turn = turnSandbox(serverProvider(), { existingSandboxId: gone })
    const { out, call } = await agentOk(turn, 'pwd; test -e old.txt && echo stale || echo fresh')
    expect(tracker.createdSince(mark)).toHaveLength(1)
    expect(call.sandboxCreated).toBe(true)
    expect(call.sessionId).not.toBe(gone)
    expect(call.sessionId).toBe(`v1:docker:${tracker.createdSince(mark)[0]}`)
    expect(out).toBe(`${rawSandboxId(call.sessionId!)}\nfresh\n`)
  })

  test('an upload to a removed session recreates too', async () => {
    const gone = await removedSession()
    const turn = turnSandbox(serverProvider(), { existingSandboxId: gone })
    const stored = await turn.uploadUserFile({ fileName: 'after.txt', content: Buffer.from('x'), mime: 'text/plain' })
    expect(stored.sandboxCreated?.sandbox_id).toMatch(/^v1:docker:/)
    expect(stored.sandboxCreated?.sandbox_id).not.toBe(gone)
  })

  test("is not recreated without the host's classes (the server's instanceof check fails)", async () => {
    const gone = await removedSession()
    const mark = tracker.created.length
    const turn = turnSandbox(tracker.provider({ tenantName: 'acme', logger: silentLogger() }), {
      existingSandboxId: gone,
    })
    const call = await agentExec(turn, 'true')
    expect(call.isError).toBe(true)
    expect(call.text).toMatch(/^Sandbox initialization failed: .*no longer exists/)
    expect(tracker.createdSince(mark)).toHaveLength(0)
  })
})
