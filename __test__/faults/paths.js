'use strict'

// Paths and names shared by the fault suite's global hooks, reporter and test files.
const path = require('node:path')

const ROOT = path.resolve(__dirname, '..', '..')

module.exports = {
  ROOT,
  ENGINE_SCRIPT: path.join(ROOT, 'scripts', 'engines', 'fault-engine.sh'),
  RESULTS_DIR: path.join(ROOT, 'test-results'),
  PARTS_DIR: path.join(ROOT, 'test-results', '.faults-parts'),
  SUMMARY_FILE: path.join(ROOT, 'test-results', 'faults.json'),
  FAULT_HOST: 'unix:///var/run/docker-faults.sock',
  MAIN_HOST: 'unix:///var/run/docker.sock',
  /** Every namespace (and CLI-made container name) of this run starts with this. */
  runPrefix: () => `flt${process.env.TRUEFORGE_FAULT_RUN || 'xxxx'}-`,
}
