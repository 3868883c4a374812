'use strict'

// Starts the isolated fault engine (scripts/engines/fault-engine.sh) and clears the per-file results.
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')

const { ENGINE_SCRIPT, PARTS_DIR, RESULTS_DIR } = require('./paths')

module.exports = async function globalSetup() {
  process.env.TRUEFORGE_FAULTS = '1'
  fs.mkdirSync(RESULTS_DIR, { recursive: true })
  fs.rmSync(PARTS_DIR, { recursive: true, force: true })
  fs.mkdirSync(PARTS_DIR, { recursive: true })
  fs.writeFileSync(`${PARTS_DIR}/run.json`, JSON.stringify({ startedAt: Date.now() }))
  process.stderr.write('\n')
  execFileSync('bash', [ENGINE_SCRIPT, 'start'], { stdio: ['ignore', 'inherit', 'inherit'], timeout: 120000 })
}
