// The fixed in-container layout, and the TrueForge server's first-use init sequence run
// against the debian image.

import { posix } from 'node:path'

import { DockerSandboxProvider } from '..'
import { BUSYBOX, DEBIAN, ok, run, SandboxTracker, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-layout')
const tracker = new SandboxTracker(namespace)
const busybox = new DockerSandboxProvider({ image: BUSYBOX, namespace })
const debian = new DockerSandboxProvider({ image: DEBIAN, namespace })

afterAll(async () => {
  await tracker.cleanup(busybox)
})

type P = typeof busybox
const getters: Array<[string, (p: P, id: string) => string]> = [
  ['getToolResultDumpDir', (p, id) => p.getToolResultDumpDir(id)],
  ['getGitCredentialsPath', (p, id) => p.getGitCredentialsPath(id)],
  ['getFileUploadsDir', (p, id) => p.getFileUploadsDir(id)],
  ['getSkillsDir', (p, id) => p.getSkillsDir(id)],
  ['getGitDownloaderPath', (p, id) => p.getGitDownloaderPath(id)],
]

test('getters return the same absolute, normalised paths for "" and for a real id', async () => {
  const id = await tracker.create(busybox)
  const other = new DockerSandboxProvider({ image: DEBIAN, namespace: 'someone-else' })
  const seen = new Set<string>()
  for (const [name, get] of getters) {
    const before = get(busybox, '')
    expect({ name, path: before }).toEqual({ name, path: expect.stringMatching(/^\/trueforge\//) })
    expect(posix.isAbsolute(before)).toBe(true)
    expect(posix.normalize(before)).toBe(before)
    expect(get(busybox, id)).toBe(before)
    expect(get(busybox, '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV')).toBe(before)
    // Independent of the provider's image and namespace too.
    expect(get(other, '')).toBe(before)
    seen.add(before)
  }
  expect(seen.size).toBe(getters.length)
  expect(busybox.getFileUploadsDir('')).toBe('/trueforge/uploads')
  expect(busybox.getSkillsDir('')).toBe('/trueforge/skills')
  expect(busybox.getToolResultDumpDir('')).toBe('/trueforge/tool-results')
  expect(busybox.getGitDownloaderPath('')).toBe('/trueforge/bin/git_downloader.py')
  expect(busybox.getGitCredentialsPath('')).toBe('/trueforge/.git-credentials')
})

test.each([
  ['busybox', () => busybox],
  ['debian', () => debian],
])('the layout dirs exist and are writable in a fresh %s sandbox', async (_name, pick) => {
  const p = pick()
  const id = await tracker.create(p)
  const dirs = [
    p.getFileUploadsDir(id),
    p.getSkillsDir(id),
    p.getToolResultDumpDir(id),
    posix.dirname(p.getGitDownloaderPath(id)),
    posix.dirname(p.getGitCredentialsPath(id)),
    id,
  ]
  for (const d of dirs) {
    expect({ dir: d, exit: (await run(p, id, `test -d '${d}' && test -w '${d}'`)).exitCode }).toEqual({
      dir: d,
      exit: 0,
    })
  }
  // The credentials file itself does not exist until the server writes it.
  expect((await run(p, id, `test -e '${p.getGitCredentialsPath(id)}'`)).exitCode).toBe(1)
})

test("the server's first-use init sequence succeeds on the debian image", async () => {
  const id = await tracker.create(debian)
  const uploads = debian.getFileUploadsDir(id)
  const skills = debian.getSkillsDir(id)
  const results = debian.getToolResultDumpDir(id)
  const downloader = debian.getGitDownloaderPath(id)
  const creds = debian.getGitCredentialsPath(id)

  // 1. mkdir -p of the three dirs.
  await ok(debian, id, `mkdir -p '${uploads}' '${skills}' '${results}'`)

  // 2. Upload the helper script, then chmod 0555 on it; a second turn does it again.
  const script = [
    'import sys, pydantic, subprocess',
    'class Skill(pydantic.BaseModel):',
    '    name: str',
    'print("downloader ok", Skill(name="s").name, sys.argv[1:])',
    'print(subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.split()[0])',
  ].join('\n')
  for (let turn = 0; turn < 2; turn++) {
    await debian.uploadFile({ sandboxId: id, remotePath: downloader, content: Buffer.from(script) })
    await ok(debian, id, `chmod 0555 '${downloader}'`)
    expect(await ok(debian, id, `stat -c %a '${downloader}'`)).toBe('555\n')
  }

  // 3. The skill init: python3 <gitDownloaderPath> (pydantic and git in the image).
  expect(await ok(debian, id, `python3 '${downloader}' --skills '${skills}'`, { timeoutSeconds: 30 })).toBe(
    `downloader ok s ['--skills', '${skills}']\ngit\n`,
  )
  expect(await ok(debian, id, "python3 -c 'import pydantic; print(pydantic.VERSION)'")).toMatch(/^\d+\.\d+/)
  expect(await ok(debian, id, 'git --version')).toMatch(/^git version \d+\.\d+/)

  // 4. Write the git credentials file, use it as the server does, then remove it.
  await ok(debian, id, `umask 077 && printf '%s\\n' 'https://user:token@git.example.com' > '${creds}'`)
  const helper = await ok(debian, id, 'git config --get credential.helper', {
    env: { GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'credential.helper', GIT_CONFIG_VALUE_0: `store --file ${creds}` },
  })
  expect(helper).toBe(`store --file ${creds}\n`)
  const filled = await ok(debian, id, "printf 'protocol=https\\nhost=git.example.com\\n\\n' | git credential fill", {
    env: { GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'credential.helper', GIT_CONFIG_VALUE_0: `store --file ${creds}` },
  })
  expect(filled).toContain('password=token')
  await ok(debian, id, `rm -f '${creds}'`)
  expect((await run(debian, id, `test -e '${creds}'`)).exitCode).toBe(1)
  // Removing it when absent is fine too (the server may do it every turn).
  await ok(debian, id, `rm -f '${creds}'`)
})
