// Capabilities a sandbox may keep (issue 20, item 4): Docker's default set only. Every other
// Linux capability, `ALL` and unknown names are refused by the constructor with INVALID_OPTION
// naming `capabilities` and the capability, for the reason the Capabilities table of
// docs/security.md gives; an allowed capability beyond the defaults is really held in a sandbox.

import { readFileSync } from 'node:fs'
import { join } from 'node:path'

import { DockerSandboxProvider } from '..'
import { BUSYBOX, ok, run, SandboxTracker, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-caps')
const sandboxes = new SandboxTracker(namespace)
const providers: InstanceType<typeof DockerSandboxProvider>[] = []

afterAll(async () => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  await sandboxes.cleanup(p)
  p.dispose()
  for (const q of providers) q.dispose()
})

/** The rows of docs/security.md's Capabilities table: [capability, why it is refused]. */
function docTable(): [string, string][] {
  const doc = readFileSync(join(__dirname, '..', 'docs', 'security.md'), 'utf8')
  const table = doc.split('\n## ').find((s) => s.startsWith('Capabilities\n'))
  if (!table) throw new Error('docs/security.md has no Capabilities section')
  return table
    .split('\n')
    .map((l) => /^\| `([A-Z_]+)` \| (.*) \|$/.exec(l))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => [m[1], m[2]])
}

/** What the constructor throws for these capabilities; null when it constructs. */
function refusal(capabilities: unknown[]): any {
  try {
    new DockerSandboxProvider({ image: BUSYBOX, namespace, capabilities } as any).dispose()
  } catch (e) {
    return e
  }
  return null
}

// linux/capability.h
const CAP_NUMBERS: Record<string, number> = { CHOWN: 0, SYS_CHROOT: 18, MKNOD: 27, NET_RAW: 13, SYSLOG: 34, BPF: 39 }

test('every capability in the docs/security.md table is refused at construction, with its reason', () => {
  const rows = docTable()
  // Linux has 41 capabilities; Docker's default set (14) is allowed, the rest listed.
  expect(rows.length).toBe(27)
  for (const [name, why] of rows) {
    for (const spelling of [name, `cap_${name.toLowerCase()}`]) {
      const e = refusal(['CHOWN', spelling])
      expect({ spelling, type: e?.constructor?.name, code: e?.code, option: e?.option }).toEqual({
        spelling,
        type: 'TypeError',
        code: 'INVALID_OPTION',
        option: 'capabilities',
      })
      expect(e.message).toContain(`invalid option \`capabilities\`: ${name} cannot be kept: it ${why}.`)
    }
  }
})

test.each([
  ['SYSLOG', /SYSLOG cannot be kept: it reads the host's kernel log/],
  ['BPF', /BPF cannot be kept: it loads BPF programs/],
  ['AUDIT_CONTROL', /AUDIT_CONTROL cannot be kept/],
  ['SYS_RESOURCE', /SYS_RESOURCE cannot be kept/],
  ['IPC_LOCK', /IPC_LOCK cannot be kept/],
  ['BOGUS', /BOGUS is not a Linux capability; a sandbox may keep only AUDIT_WRITE, CHOWN/],
  ['ALL', /ALL would keep every capability/],
  ['cap_all', /ALL would keep every capability/],
])('%s is refused at construction with INVALID_OPTION naming capabilities and it', (cap, reason) => {
  const e = refusal([cap])
  expect(e).toBeInstanceOf(TypeError)
  expect(e.code).toBe('INVALID_OPTION')
  expect(e.option).toBe('capabilities')
  expect(e.message).toMatch(reason)
})

test('the rest of Docker default set may be kept, and a sandbox then holds exactly what was asked', async () => {
  // Every allowed name constructs (lower case and the CAP_ prefix too).
  for (const c of ['AUDIT_WRITE', 'MKNOD', 'NET_RAW', 'SETFCAP', 'SETPCAP', 'SYS_CHROOT', 'cap_net_raw']) {
    expect({ c, refused: refusal([c])?.message ?? null }).toEqual({ c, refused: null })
  }
  const p = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    capabilities: ['CHOWN', 'NET_RAW', 'MKNOD', 'sys_chroot'],
  })
  providers.push(p)
  const id = await sandboxes.create(p)
  const status = await ok(p, id, 'grep -E "^Cap(Eff|Bnd):" /proc/self/status')
  const want = ['CHOWN', 'NET_RAW', 'MKNOD', 'SYS_CHROOT'].reduce((m, c) => m | (1n << BigInt(CAP_NUMBERS[c])), 0n)
  for (const line of status.trim().split('\n')) {
    const [field, hex] = line.split(/:\s*/)
    expect({ field, mask: BigInt(`0x${hex}`).toString(16) }).toEqual({ field, mask: want.toString(16) })
  }
  // Kept capabilities work: a device node, a chroot.
  expect(await ok(p, id, 'mknod /tmp/null2 c 1 3 && echo x > /tmp/null2 && chroot / true && echo kept')).toBe('kept\n')
  // The kernel log stays closed (no SYSLOG).
  expect((await run(p, id, 'dmesg >/dev/null 2>&1')).exitCode).not.toBe(0)
}, 60_000)
