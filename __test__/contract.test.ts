// The four behaviours of TrueForge's own SandboxProvider contract suite, on the TrueForge-ready
// image (user `agent`, not root), the default image of the tests and the demo.

import { randomBytes } from 'node:crypto'
import { posix } from 'node:path'

import { DockerSandboxProvider } from '..'
import { ok, run, SandboxTracker, TRUEFORGE, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-contract')
const tracker = new SandboxTracker(namespace)
const provider = new DockerSandboxProvider({ image: TRUEFORGE, namespace })

let a: string
let b: string

beforeAll(async () => {
  ;[a, b] = await Promise.all([tracker.create(provider), tracker.create(provider)])
})

afterAll(async () => {
  await tracker.cleanup(provider)
})

test('1. pwd prints exactly the sandbox id, and relative paths work from there', async () => {
  expect(a).toMatch(/^\/workspace\/[0-9A-HJKMNP-TV-Z]{26}$/)
  const pwd = await ok(provider, a, 'pwd')
  expect(pwd.replace(/\n$/, '')).toBe(a)

  await ok(provider, a, 'mkdir -p skills')
  const inside = await ok(provider, a, 'test -d skills && cd skills && pwd')
  expect(inside.replace(/\n$/, '')).toBe(`${a}/skills`)
  // And it is really under the id, seen by absolute path.
  await ok(provider, a, `test -d ${a}/skills`)
})

test('2. a file written by one exec is read back by the next', async () => {
  await ok(provider, a, "printf 'persisted %s\\n' across-execs > note.txt")
  const out = await ok(provider, a, 'cat note.txt')
  expect(out).toBe('persisted across-execs\n')
})

test('3. two sandboxes are isolated: reads and writes from B never reach A', async () => {
  expect(a).not.toBe(b)
  const secret = `secret-${randomBytes(8).toString('hex')}`
  await ok(provider, a, `printf %s ${secret} > secret.txt`)
  const aBase = posix.basename(a)

  // Reads from B: each ran (success: true) and failed (non-zero).
  for (const path of ['secret.txt', `../${aBase}/secret.txt`, `${a}/secret.txt`]) {
    const r = await run(provider, b, `cat ${path}`)
    expect(r.exitCode).not.toBe(0)
    expect(r.result).not.toContain(secret)
  }

  // Writes from B to A's places fail.
  for (const path of [`../${aBase}/secret.txt`, `${a}/secret.txt`, `../${aBase}/from-b.txt`, `${a}/from-b.txt`]) {
    const r = await run(provider, b, `echo overwritten-by-b > ${path}`)
    expect(r.exitCode).not.toBe(0)
  }
  // A write to the same relative name lands in B's own root, not in A.
  await ok(provider, b, 'echo overwritten-by-b > secret.txt')
  // Even making A's path inside B and writing there only touches B's container.
  await ok(provider, b, `mkdir -p ${a} && echo overwritten-by-b > ${a}/secret.txt && echo x > ${a}/from-b.txt`)

  // Nothing B tried appears in A.
  expect(await ok(provider, a, 'cat secret.txt')).toBe(secret)
  await expect(run(provider, a, 'test -e from-b.txt')).resolves.toMatchObject({ exitCode: 1 })
  const listing = await ok(provider, a, 'ls -A')
  expect(listing).not.toContain('from-b')
  const grep = await run(provider, a, `grep -rl overwritten-by-b ${a} /workspace`)
  expect(grep.exitCode).not.toBe(0)
  expect(grep.result).toBe('')
  // A cannot see B either.
  const bFromA = await run(provider, a, `ls ${b}`)
  expect(bFromA.exitCode).not.toBe(0)
})

test('4. uploadFile then downloadFile returns the same bytes', async () => {
  const content = randomBytes(64 * 1024)
  await provider.uploadFile({ sandboxId: a, remotePath: 'blob.bin', content })
  const back = await provider.downloadFile({ sandboxId: a, path: 'blob.bin' })
  expect(Buffer.isBuffer(back)).toBe(true)
  expect(back.length).toBe(content.length)
  expect(back.equals(content)).toBe(true)
  // The absolute path names the same file.
  const abs = await provider.downloadFile({ sandboxId: a, path: `${a}/blob.bin` })
  expect(abs.equals(content)).toBe(true)
})
