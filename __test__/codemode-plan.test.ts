// A large Code Mode request is checked and measured natively, then built by its plan on the
// JavaScript thread in slices (lib/transport.js, `buildByPlan`). The value built must be exactly what
// `JSON.parse` of the same text gives, for any text; the native check must refuse exactly what
// `JSON.parse` refuses. No engine here: this is the parser itself.

import fc from 'fast-check'

// The binding's measuring entry point and the builder are internal: not part of the package's API.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { codeModeMeasure } = require('../lib/loader.js') as {
  codeModeMeasure: (
    payload: Buffer,
    smallSteps?: boolean,
  ) => { heap: number; values: number; plan: Uint32Array | null; unfit: string | null }
}
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { buildByPlan } = require('../lib/transport.js') as {
  buildByPlan: (bytes: Buffer, plan: Uint32Array) => Promise<unknown>
}

// The addon's typed arrays come from Node's own realm, not jest's sandbox: no instanceof.
const isPlan = (p: unknown): p is Uint32Array => Object.prototype.toString.call(p) === '[object Uint32Array]'

let planned = 0

/**
 * Builds `text` by its plan of tiny steps (every kind of step shows up in small texts). Values
 * too small for even these steps have no plan: the host parses those whole.
 */
async function rebuilt(text: string): Promise<unknown> {
  const bytes = Buffer.from(text)
  const m = codeModeMeasure(bytes, true)
  expect(m.unfit ?? null).toBeNull()
  if (!isPlan(m.plan)) return JSON.parse(text)
  planned++
  return buildByPlan(bytes, m.plan)
}

test('values built by plan are those JSON.parse makes, prototype keys and all', async () => {
  const texts = [
    '{"op":"call_tool","server":"s","tool":"t","arguments":{"__proto__":{"polluted":true},"a":[1,2,{"b":null}]}}',
    JSON.stringify({ text: 'line\n"quoted" é € 😀 \\ \u0001'.repeat(30), n: -1.5e-7, big: 2 ** 64 }),
    JSON.stringify([[['x'.repeat(300)]], { k: 'y'.repeat(300), '': 'empty key', '0': 'number key' }, []]),
    '"\\ud83d\\ude00 lone: \\ud800 end"',
    '  { "spaced" :  [ 1 ,\n 2 ] ,\t"dup": 1, "dup": 2 }  ',
    '{"__proto__":[1,2,3],"x":{"__proto__":null}}',
  ]
  planned = 0
  for (const text of texts) {
    const built = await rebuilt(text)
    expect(built).toEqual(JSON.parse(text))
    expect(JSON.stringify(built)).toBe(JSON.stringify(JSON.parse(text)))
  }
  expect(planned).toBe(texts.length)
  const polluted = (await rebuilt(texts[0])) as { arguments: Record<string, unknown> }
  expect(Object.getPrototypeOf(polluted.arguments)).toBe(Object.prototype)
  expect(Object.keys(polluted.arguments)).toEqual(['__proto__', 'a'])
  expect(({} as Record<string, unknown>).polluted).toBeUndefined()
})

test('any JSON text: the plan rebuilds what JSON.parse makes', async () => {
  planned = 0
  await fc.assert(
    fc.asyncProperty(fc.jsonValue(), fc.boolean(), async (value, pretty) => {
      const text = JSON.stringify(value, null, pretty ? 2 : undefined)
      expect(JSON.stringify(await rebuilt(text))).toBe(JSON.stringify(JSON.parse(text)))
    }),
    { numRuns: 300 },
  )
  expect(planned).toBeGreaterThan(50)
})

test('texts JSON.parse refuses are refused natively, before any JavaScript value exists', () => {
  fc.assert(
    fc.property(fc.string({ unit: 'binary' }), (text) => {
      let parses = true
      try {
        JSON.parse(text)
      } catch {
        parses = false
      }
      const m = codeModeMeasure(Buffer.from(text))
      // Deeper than the bound or keys longer than it are refused on their own terms.
      if (parses) expect(m.unfit ?? null).toBeNull()
      else expect(m.unfit).toBe('Malformed Code Mode request')
    }),
    { numRuns: 2000 },
  )
  for (const bad of ['[1,]', '{"a":1,}', '01', '"\\x"', '[1 2]', 'NaN', '"\t"', '{"a"}', '']) {
    expect(codeModeMeasure(Buffer.from(bad)).unfit).toBe('Malformed Code Mode request')
  }
})

test('a large request is planned; building it gives the event loop back between slices', async () => {
  const rows = Array.from({ length: 40_000 }, (_, i) => ({ id: i, name: `row ${i}`, tags: ['a', 'b'] }))
  const text = JSON.stringify({ rows, blob: 'x'.repeat(3 << 20) })
  const bytes = Buffer.from(text)
  const m = codeModeMeasure(bytes)
  expect(isPlan(m.plan)).toBe(true)
  let ticks = 0
  const timer = setInterval(() => ticks++, 0)
  try {
    const built = await buildByPlan(bytes, m.plan as Uint32Array)
    expect(JSON.stringify(built)).toBe(text)
  } finally {
    clearInterval(timer)
  }
  // Timers ran while it was built: it did not hold the loop from start to end.
  expect(ticks).toBeGreaterThan(0)
})
