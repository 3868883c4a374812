'use strict'
// The contract's four behaviours (as in __test__/contract.test.ts) plus an exec, run through the
// package as a consumer installed it: `trueforge-docker-sandbox` resolves from the current
// directory's node_modules. No test runner, so it runs on any Node.js (also an emulated arm64 one
// under qemu-user). Prints which Node.js, which CPU and which platform package's binary loaded.
// Usage: node scripts/ci/contract-installed.js [expected platform package suffix, e.g. linux-arm64-gnu]
const assert = require('node:assert/strict')
const { randomBytes } = require('node:crypto')
const { createRequire } = require('node:module')
const path = require('node:path')

// Resolved as a file in the current directory would: this script sits inside the package's own
// folder, where its name would resolve to the package itself (self-reference through `exports`).
const installed = createRequire(path.join(process.cwd(), 'consumer.js'))
const { DockerSandboxProvider } = installed('trueforge-docker-sandbox')

async function ok(provider, sandboxId, command) {
  const r = await provider.exec({ sandboxId, command })
  assert.ok(r.success && r.response.exitCode === 0, `${command}: ${JSON.stringify(r)}`)
  return r.response.result
}

async function fails(provider, sandboxId, command) {
  const r = await provider.exec({ sandboxId, command })
  assert.ok(r.success && r.response.exitCode !== 0, `${command} should fail: ${JSON.stringify(r)}`)
  return r.response.result
}

async function main() {
  const loaded = Object.keys(require.cache).filter((f) => f.endsWith('.node'))
  assert.equal(loaded.length, 1, `one native binary loaded: ${loaded}`)
  const expected = process.argv[2]
  if (expected) {
    const dir = path.basename(path.dirname(loaded[0]))
    assert.equal(dir, `trueforge-docker-sandbox-${expected}`, `binary from the platform package: ${loaded[0]}`)
  }

  const namespace = `ci-plat-${randomBytes(3).toString('hex')}`
  const provider = new DockerSandboxProvider({ image: 'trueforge-sandbox-busybox:1', namespace })
  const made = []
  try {
    const [a, b] = await Promise.all([provider.createSandbox(), provider.createSandbox()]).then((r) =>
      r.map((s) => s.sandboxId),
    )
    made.push(a, b)

    // 1. pwd is the id; relative paths work from there.
    assert.match(a, /^\/workspace\/[0-9A-HJKMNP-TV-Z]{26}$/)
    assert.equal((await ok(provider, a, 'pwd')).trim(), a)
    await ok(provider, a, 'mkdir -p skills')
    assert.equal((await ok(provider, a, 'cd skills && pwd')).trim(), `${a}/skills`)

    // 2. A file written by one exec is read by the next.
    await ok(provider, a, "printf 'persisted %s\\n' across-execs > note.txt")
    assert.equal(await ok(provider, a, 'cat note.txt'), 'persisted across-execs\n')

    // 3. Isolation: B neither reads nor writes A's files.
    const secret = `secret-${randomBytes(8).toString('hex')}`
    await ok(provider, a, `printf %s ${secret} > secret.txt`)
    const out = await fails(provider, b, `cat ${a}/secret.txt`)
    assert.ok(!out.includes(secret))
    await ok(provider, b, `mkdir -p ${a} && echo from-b > ${a}/secret.txt`)
    assert.equal(await ok(provider, a, 'cat secret.txt'), secret)
    await fails(provider, a, `ls ${b}`)

    // 4. Upload then download returns the same bytes (relative and absolute path).
    const content = randomBytes(64 * 1024)
    await provider.uploadFile({ sandboxId: a, remotePath: 'blob.bin', content })
    const back = await provider.downloadFile({ sandboxId: a, path: 'blob.bin' })
    assert.ok(Buffer.isBuffer(back) && back.equals(content), 'download of blob.bin equals the upload')
    assert.ok((await provider.downloadFile({ sandboxId: a, path: `${a}/blob.bin` })).equals(content))

    console.log(
      `contract passed: Node.js ${process.version} ${process.platform}-${process.arch}, ` +
        `binary ${path.relative(process.cwd(), loaded[0])}`,
    )
  } finally {
    await Promise.all(made.map((id) => provider.removeSandbox(id)))
    provider.dispose()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
