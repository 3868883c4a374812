'use strict'

// The fault-tolerance suite: `npx jest -c jest.faults.config.js`. It injects faults (engine
// restart, stop and freeze, container kill, concurrent starts, load, output floods, idle stop
// and reaping) against a second, isolated Docker engine that scripts/fault-engine.sh runs, so
// the main engine (shared with every other test run) is never stopped or frozen. The global
// setup starts that engine and the global teardown removes it; the summary (calls made, faults
// injected, calls lost, containers leaked, memory growth) is printed at the end and written to
// test-results/faults.json.

const { randomBytes } = require('node:crypto')

// Read by the test files (the default `jest` run leaves them skipped) and by the global hooks.
process.env.TRUEFORGE_FAULTS = '1'
// Every namespace this run makes starts with `flt<run>-`, so the teardown can find (and only
// find) what this run left on either engine.
if (!process.env.TRUEFORGE_FAULT_RUN) process.env.TRUEFORGE_FAULT_RUN = randomBytes(2).toString('hex')

/** @type {import('jest').Config} */
module.exports = {
  displayName: 'faults',
  rootDir: __dirname,
  testEnvironment: 'node',
  // Faults are injected into one shared engine: one file at a time, in this process.
  maxWorkers: 1,
  testTimeout: 180000,
  transform: {
    '^.+\\.(t|j)sx?$': ['@swc/jest'],
  },
  testMatch: ['<rootDir>/__test__/faults/**/*.test.ts'],
  testSequencer: '<rootDir>/__test__/faults/sequencer.js',
  globalSetup: '<rootDir>/__test__/faults/global-setup.js',
  globalTeardown: '<rootDir>/__test__/faults/global-teardown.js',
  reporters: ['default', '<rootDir>/__test__/faults/summary-reporter.js'],
}
