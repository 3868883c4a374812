// Every public name imports by name from an ES module, exactly as it requires from CommonJS.

import { execFileSync } from 'node:child_process'
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'

const entry = resolve(__dirname, '..', 'index.js')

test('an ES module imports every export by name', () => {
  const cjsNames = Object.keys(require('..')).sort()
  expect(cjsNames).toEqual(
    expect.arrayContaining(['DockerSandboxProvider', 'reapSandboxes', 'SandboxNotAvailableError']),
  )
  const url = pathToFileURL(entry).href
  // A named import of a name Node cannot see statically fails at link time, before any code runs.
  const source = [
    `import { ${cjsNames.join(', ')} } from ${JSON.stringify(url)}`,
    `import * as ns from ${JSON.stringify(url)}`,
    `const names = { ${cjsNames.join(', ')} }`,
    `const missing = Object.entries(names).filter(([, v]) => v === undefined).map(([k]) => k)`,
    `console.log(JSON.stringify({ missing, named: Object.keys(ns).filter((k) => k !== 'default').sort() }))`,
  ].join('\n')
  const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', source], { encoding: 'utf8' }))
  expect(out.missing).toEqual([])
  expect(out.named).toEqual(cjsNames)
})
