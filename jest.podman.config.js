'use strict'

// The contract, exec, transfer and lifecycle suites against Podman's Docker-compatible API
// (scripts/podman-engine.sh: rootful, its own socket and network namespace; scripts/podman-rootless-engine.sh: rootless, as its own user): run as
// `DOCKER_HOST=unix:///run/tf-podman/podman.sock npx jest -c jest.podman.config.js` (the provider
// and the tests' docker CLI both follow DOCKER_HOST). Security on Podman is checked by
// __test__/engines/podman.test.ts instead of security.test.ts, whose inspect-format
// assertions are Docker's spellings; what differs on Podman is listed in docs/podman.md.

/** @type {import('jest').Config} */
module.exports = {
  displayName: 'podman',
  rootDir: __dirname,
  testEnvironment: 'node',
  testTimeout: 90000,
  maxWorkers: 2,
  transform: {
    '^.+\\.(t|j)sx?$': ['@swc/jest'],
  },
  testMatch: [
    '<rootDir>/__test__/{contract,exec,transfer,lifecycle}.test.ts',
    '<rootDir>/__test__/engines/podman.test.ts',
  ],
}
