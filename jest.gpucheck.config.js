'use strict'

// The GPU bundle check alone: `jest -c jest.gpucheck.config.js` (npm run test:gpu-check). It
// builds scripts/gpu-bundle.sh's folders (Debian packages are downloaded) and runs
// scripts/gpu-check.sh from one here; it writes a CDI spec in /var/run/cdi for a moment, which a
// test discovering GPUs on a local engine would see, so it runs apart from the default suite.

const { displayName, testMatch, testPathIgnorePatterns, ...shared } = require('./jest.config.js')

/** @type {import('jest').Config} */
module.exports = {
  ...shared,
  displayName: 'gpu-check',
  maxWorkers: 1,
  testTimeout: 300000,
  testMatch: ['<rootDir>/__test__/gpu-check.spec.ts'],
}
