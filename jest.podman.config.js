'use strict'

// The contract, exec, transfer, lifecycle, security, network and egress suites against Podman's Docker-compatible
// API: rootful (scripts/podman-engine.sh, its own socket and network namespace) and rootless
// (scripts/podman-rootless-engine.sh, its own user). Run as
// `DOCKER_HOST=unix:///run/tf-podman/podman.sock npx jest -c jest.podman.config.js` (the provider
// and the tests' docker CLI both follow DOCKER_HOST). security.test.ts skips, saying why, its
// checks of Docker's inspect spellings (and, where a rootless Podman on cgroup v1 ignores them,
// of resource limits); __test__/engines/podman.test.ts checks the effective result on Podman
// instead. What differs on Podman is listed in docs/podman.md.

/** @type {import('jest').Config} */
module.exports = {
  displayName: 'podman',
  rootDir: __dirname,
  testEnvironment: 'node',
  testTimeout: 90000,
  maxWorkers: 2,
  globalTeardown: '<rootDir>/__test__/networks-teardown.js',
  transform: {
    '^.+\\.(t|j)sx?$': ['@swc/jest'],
  },
  testMatch: [
    '<rootDir>/__test__/{contract,exec,transfer,lifecycle,security,network,egress}.test.ts',
    '<rootDir>/__test__/engines/podman.test.ts',
  ],
}
