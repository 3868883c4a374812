'use strict'

// The contract, exec, transfer, agent, Code Mode, security and egress suites (and the gVisor checks of
// __test__/engines/gvisor.test.ts) with `runtime: 'runsc'` on the engine of
// scripts/gvisor-engine.sh, which registers gVisor's runsc through its own config file:
//
//   bash scripts/gvisor-engine.sh start && npx jest -c jest.runsc.config.js; bash scripts/gvisor-engine.sh teardown
//
// (`npm run test:runsc` does that). The provider and the tests' docker CLI follow DOCKER_HOST,
// which defaults to that engine here; __test__/engines/runtime-setup.js gives every provider
// without a `runtime` option TRUEFORGE_TEST_RUNTIME (default runsc). What gVisor itself cannot
// do is skipped, saying why, where the tests check it (`onRunsc` in __test__/helpers.ts).

const path = require('node:path')

process.env.DOCKER_HOST ??= 'unix:///var/run/docker-gvisor.sock'
process.env.TRUEFORGE_TEST_RUNTIME ??= 'runsc'
const setup = path.join(__dirname, '__test__', 'engines', 'runtime-setup.js')
// Node processes the tests start make providers too.
if (!(process.env.NODE_OPTIONS ?? '').includes(setup)) {
  process.env.NODE_OPTIONS = `${process.env.NODE_OPTIONS ?? ''} --require ${setup}`.trim()
}

/** @type {import('jest').Config} */
module.exports = {
  displayName: 'runsc',
  rootDir: __dirname,
  testEnvironment: 'node',
  // Every command and file call crosses gVisor's ptrace platform.
  testTimeout: 180000,
  maxWorkers: 2,
  setupFiles: [setup],
  globalTeardown: '<rootDir>/__test__/networks-teardown.js',
  transform: {
    '^.+\\.(t|j)sx?$': ['@swc/jest'],
  },
  testMatch: [
    '<rootDir>/__test__/{contract,exec,transfer,agent,agent-fallback,codemode,security,egress}.test.ts',
    '<rootDir>/__test__/engines/gvisor.test.ts',
  ],
}
