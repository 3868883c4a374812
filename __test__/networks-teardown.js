'use strict'

// After a test run: removes the networks the provider made (one per namespace and tenant; they
// outlive their sandboxes on purpose) that no container, running or stopped, still names, so
// test namespaces do not use up the engine's address pools. Follows DOCKER_HOST like the tests.

const { spawnSync } = require('node:child_process')

const docker = (args) => spawnSync('docker', args, { encoding: 'utf8', timeout: 60_000 })

module.exports = async function removeUnusedNetworks() {
  const ls = docker(['network', 'ls', '-q', '--filter', 'label=trueforge.sandbox.managed-by=trueforge-docker-sandbox'])
  for (const id of (ls.stdout || '').split('\n').filter(Boolean)) {
    const users = docker(['ps', '-aq', '--filter', `network=${id}`])
    if (users.status === 0 && users.stdout.trim() === '') docker(['network', 'rm', id])
  }
}
