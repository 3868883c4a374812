'use strict'

// Loaded before each test file of the runsc jest project (and, through NODE_OPTIONS, in the node
// processes the tests start): every provider made without a `runtime` option gets
// TRUEFORGE_TEST_RUNTIME, so the suites run unchanged under that runtime (runsc on the engine of
// scripts/engines/gvisor-engine.sh). A test that names a runtime keeps its own.

const path = require('node:path')

const runtime = process.env.TRUEFORGE_TEST_RUNTIME
const pkg = require(path.join(__dirname, '..', '..', 'index.js'))

if (runtime && !pkg.DockerSandboxProvider.__testRuntime) {
  const Base = pkg.DockerSandboxProvider
  class WithRuntime extends Base {
    constructor(options = {}, ...rest) {
      const given = options && typeof options === 'object' && !Array.isArray(options)
      super(given && options.runtime === undefined ? { ...options, runtime } : options, ...rest)
    }
  }
  Object.defineProperty(WithRuntime, 'name', { value: Base.name })
  WithRuntime.__testRuntime = runtime
  pkg.DockerSandboxProvider = WithRuntime
}
