'use strict'

// The default test run: every integration test in __test__/ except the GPU one, which needs an
// engine that offers GPUs and runs through `jest -c jest.gpu.config.js`.

/** @type {import('jest').Config} */
module.exports = {
  displayName: 'default',
  rootDir: __dirname,
  testEnvironment: 'node',
  testTimeout: 60000,
  maxWorkers: 2,
  globalTeardown: '<rootDir>/__test__/networks-teardown.js',
  transform: {
    '^.+\\.(t|j)sx?$': ['@swc/jest'],
  },
  testMatch: ['<rootDir>/__test__/**/*.test.ts'],
  testPathIgnorePatterns: [
    '/node_modules/',
    '<rootDir>/__test__/gpu\\.test\\.ts$',
    '<rootDir>/__test__/faults/',
    '<rootDir>/__test__/trueforge/',
  ],
}
