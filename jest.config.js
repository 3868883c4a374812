'use strict'

// Every test suite, one jest project each. Each suite runs apart, most on an engine of its own,
// so a run holds one project:
//
//   npx jest                              the default project (npm test)
//   npx jest --selectProjects faults      the fault suite (npm run test:faults)
//   npx jest --selectProjects gpu         the GPU smoke test (npm run test:gpu)
//   npx jest --selectProjects gpu-check   the GPU bundle check (npm run test:gpu-check)
//   npx jest --selectProjects podman      the Podman suites (npm run test:podman, test:podman-rootless)
//   npx jest --selectProjects runsc       the gVisor suites (npm run test:runsc)
//
// Workers, reporters and test order are jest's global settings, not a project's, and the fault
// and gVisor suites set environment variables for the processes the tests start; so this file
// reads which project the command line selects (jest takes every argument after
// `--selectProjects` that is not an option as a project name: put test paths before it) and sets
// those for it alone.

const path = require('node:path')
const { randomBytes } = require('node:crypto')

const transform = { '^.+\\.(t|j)sx?$': ['@swc/jest'] }
const networksTeardown = '<rootDir>/__test__/networks-teardown.js'
const runtimeSetup = path.join(__dirname, '__test__', 'engines', 'runtime-setup.js')

/**
 * Each project: `project` (its jest project options), `global` (the global options it needs) and
 * `env` (what it sets in the environment before the run).
 * @type {Record<string, { project: import('jest').Config, global: import('jest').Config, env?: () => void }>}
 */
const SUITES = {
  // Every integration test in __test__/ except the GPU one, which needs an engine that offers
  // GPUs, the GPU bundle check and the fault and TrueForge suites.
  default: {
    project: {
      testTimeout: 60000,
      globalTeardown: networksTeardown,
      testMatch: ['<rootDir>/__test__/**/*.test.ts'],
      testPathIgnorePatterns: [
        '/node_modules/',
        '<rootDir>/__test__/gpu\\.test\\.ts$',
        '<rootDir>/__test__/faults/',
        '<rootDir>/__test__/trueforge/',
      ],
    },
    global: { maxWorkers: 2, testTimeout: 60000 },
  },

  // The fault-tolerance suite. It injects faults (engine restart, stop and freeze, container kill,
  // concurrent starts, load, output floods, idle stop and reaping) against a second, isolated
  // Docker engine that scripts/engines/fault-engine.sh runs, so the main engine (shared with every other
  // test run) is never stopped or frozen. The global setup starts that engine and the global
  // teardown removes it; the summary (calls made, faults injected, calls lost, containers leaked,
  // memory growth) is printed at the end and written to test-results/faults.json.
  faults: {
    project: {
      testTimeout: 180000,
      testMatch: ['<rootDir>/__test__/faults/**/*.test.ts'],
      globalSetup: '<rootDir>/__test__/faults/global-setup.js',
      globalTeardown: '<rootDir>/__test__/faults/global-teardown.js',
    },
    global: {
      // Faults are injected into one shared engine: one file at a time, in this process.
      maxWorkers: 1,
      testTimeout: 180000,
      testSequencer: '<rootDir>/__test__/faults/sequencer.js',
      reporters: ['default', '<rootDir>/__test__/faults/summary-reporter.js'],
    },
    env() {
      // Read by the test files (the default run leaves them skipped) and by the global hooks.
      process.env.TRUEFORGE_FAULTS = '1'
      // Every namespace this run makes starts with `flt<run>-`, so the teardown can find (and
      // only find) what this run left on either engine.
      if (!process.env.TRUEFORGE_FAULT_RUN) process.env.TRUEFORGE_FAULT_RUN = randomBytes(2).toString('hex')
    },
  },

  // The GPU test alone, with the default project's settings; it skips itself, saying why, when
  // the Docker engine offers no GPU.
  gpu: {
    project: {
      testTimeout: 60000,
      globalTeardown: networksTeardown,
      testMatch: ['<rootDir>/__test__/gpu.test.ts'],
    },
    global: { maxWorkers: 2, testTimeout: 60000 },
  },

  // The GPU bundle check alone (npm run test:gpu-check). It builds scripts/build/gpu-bundle.sh's
  // folders (Debian packages are downloaded) and runs scripts/ci/gpu-check.sh from one here; it
  // writes a CDI spec in /var/run/cdi for a moment, which a test discovering GPUs on a local
  // engine would see, so it runs apart from the default suite.
  'gpu-check': {
    project: {
      testTimeout: 300000,
      globalTeardown: networksTeardown,
      testMatch: ['<rootDir>/__test__/gpu-check.spec.ts'],
    },
    global: { maxWorkers: 1, testTimeout: 300000 },
  },

  // The contract, exec, transfer, lifecycle, security, network and egress suites against Podman's
  // Docker-compatible API: rootful (scripts/engines/podman-engine.sh, its own socket and network
  // namespace) and rootless (scripts/engines/podman-rootless-engine.sh, its own user). Run as
  // `DOCKER_HOST=unix:///run/tf-podman/podman.sock npx jest --selectProjects podman` (the
  // provider and the tests' docker CLI both follow DOCKER_HOST). security.test.ts skips, saying
  // why, its checks of Docker's inspect spellings (and, where a rootless Podman on cgroup v1
  // ignores them, of resource limits); __test__/engines/podman.test.ts checks the effective
  // result on Podman instead. What differs on Podman is listed in docs/podman.md.
  podman: {
    project: {
      testTimeout: 90000,
      globalTeardown: networksTeardown,
      testMatch: [
        '<rootDir>/__test__/{contract,exec,transfer,lifecycle,security,network,egress}.test.ts',
        '<rootDir>/__test__/engines/podman.test.ts',
      ],
    },
    global: { maxWorkers: 2, testTimeout: 90000 },
  },

  // The contract, exec, transfer, agent, Code Mode, security and egress suites (and the gVisor
  // checks of __test__/engines/gvisor.test.ts) with `runtime: 'runsc'` on the engine of
  // scripts/engines/gvisor-engine.sh, which registers gVisor's runsc through its own config file:
  //
  //   bash scripts/engines/gvisor-engine.sh start && npx jest --selectProjects runsc; bash scripts/engines/gvisor-engine.sh teardown
  //
  // (`npm run test:runsc` does that). The provider and the tests' docker CLI follow DOCKER_HOST,
  // which defaults to that engine here; __test__/engines/runtime-setup.js gives every provider
  // without a `runtime` option TRUEFORGE_TEST_RUNTIME (default runsc). What gVisor itself cannot
  // do is skipped, saying why, where the tests check it (`onRunsc` in __test__/helpers.ts).
  runsc: {
    project: {
      // Every command and file call crosses gVisor's ptrace platform.
      testTimeout: 180000,
      setupFiles: [runtimeSetup],
      globalTeardown: networksTeardown,
      testMatch: [
        '<rootDir>/__test__/{contract,exec,transfer,agent,agent-fallback,codemode,security,egress}.test.ts',
        '<rootDir>/__test__/engines/gvisor.test.ts',
      ],
    },
    global: { maxWorkers: 2, testTimeout: 180000 },
    env() {
      process.env.DOCKER_HOST ??= 'unix:///var/run/docker-gvisor.sock'
      process.env.TRUEFORGE_TEST_RUNTIME ??= 'runsc'
      // Node processes the tests start make providers too.
      if (!(process.env.NODE_OPTIONS ?? '').includes(runtimeSetup)) {
        process.env.NODE_OPTIONS = `${process.env.NODE_OPTIONS ?? ''} --require ${runtimeSetup}`.trim()
      }
    },
  },
}

/**
 * The project names the command line selects, as jest reads them: `--selectProjects a b` or
 * `--selectProjects=a b` (also spelt `--select-projects`), up to the next option.
 * @param {string[]} argv
 */
function selectedProjects(argv) {
  const names = []
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s)
    if (flag !== '--selectProjects' && flag !== '--select-projects') continue
    if (inline !== undefined) names.push(inline)
    while (i + 1 < argv.length && !argv[i + 1].startsWith('-')) names.push(argv[++i])
  }
  return [...new Set(names)]
}

const selected = selectedProjects(process.argv.slice(2))
const known = selected.filter((name) => Object.hasOwn(SUITES, name))
if (known.length > 1) {
  throw new Error(
    `jest.config.js: select one project per run (each suite needs its own engine), not ${known.join(', ')}`,
  )
}
// No selection is the default project; a name that is no project is left to jest to refuse.
const name = known[0] ?? 'default'
const suite = SUITES[name]
suite.env?.()

/** @type {import('jest').Config} */
module.exports = {
  rootDir: __dirname,
  ...suite.global,
  projects: [{ displayName: name, rootDir: __dirname, testEnvironment: 'node', transform, ...suite.project }],
}
