'use strict'

// One memory probe, run by run.js in a child process of its own (`node --expose-gc`) so that
// no other measurement's heap or allocator state pollutes it. Reports the peak resident set
// size growth over the baseline while one 100 MiB upload or download runs.
//
// Input (JSON in BENCH_PROBE): { impl, dir: 'upload'|'download', id, path, size }.
// Output: one IPC message { ok, baseline, peak, growth, ms, samples } or { ok: false, error }.

const SAMPLE_MS = 2

function makePayload(size) {
  // Every page written, so the payload is resident before the baseline is taken.
  const b = Buffer.allocUnsafe(size)
  for (let i = 0; i < size; i += 4) b.writeUInt32LE((i * 2654435761) >>> 0, i)
  return b
}

async function makeImpl(name) {
  const common = require('./impl/common')
  if (name === 'addon' || name === common.ENGINE_PATH) {
    const addon = require('./impl/addon')
    await addon.load()
    return name === 'addon'
      ? addon.create()
      : addon.create({ name, namespace: common.ADDON_ENGINE_NAMESPACE, extra: { agent: false } })
  }
  return require(`./impl/${name}`).create()
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function settle() {
  // Two collections with a pause between them, so the baseline is not inflated by garbage.
  global.gc()
  await sleep(50)
  global.gc()
  await sleep(50)
}

async function main() {
  const { impl: name, dir, id, path, size } = JSON.parse(process.env.BENCH_PROBE)
  const impl = await makeImpl(name)
  // Warm-up with a small file: opens connections and starts thread pools. A 100 MiB warm-up
  // would leave freed memory with the allocator and hide the operation's real need.
  const warm = `${path}.warm`
  await impl.upload(id, warm, Buffer.alloc(1024, 1))
  await impl.download(id, warm)

  let payload = dir === 'upload' ? makePayload(size) : null
  await settle()
  const baseline = process.memoryUsage.rss()
  let peak = baseline
  let samples = 0
  const sample = () => {
    const r = process.memoryUsage.rss()
    if (r > peak) peak = r
    samples++
  }
  const timer = setInterval(sample, SAMPLE_MS)
  const t0 = performance.now()
  let got = null
  if (dir === 'upload') await impl.upload(id, path, payload)
  else got = await impl.download(id, path)
  const ms = performance.now() - t0
  sample() // the result is still referenced here, so this counts it
  clearInterval(timer)
  if (dir === 'download' && got.length !== size) throw new Error(`downloaded ${got.length} bytes, expected ${size}`)
  payload = null
  got = null
  return { ok: true, baseline, peak, growth: peak - baseline, ms, samples }
}

main().then(
  (r) => process.send(r, () => process.exit(0)),
  (e) => process.send({ ok: false, error: String((e && e.stack) || e) }, () => process.exit(0)),
)
