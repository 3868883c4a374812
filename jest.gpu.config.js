'use strict'

// The GPU test alone: `jest -c jest.gpu.config.js`. Same settings as the default run; it skips
// itself, saying why, when the Docker engine offers no GPU.

const { displayName, testMatch, testPathIgnorePatterns, ...shared } = require('./jest.config.js')

/** @type {import('jest').Config} */
module.exports = {
  ...shared,
  displayName: 'gpu',
  testMatch: ['<rootDir>/__test__/gpu.test.ts'],
}
