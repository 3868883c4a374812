'use strict'

// What the package offers beside the provider class: the functions that need no provider
// (`reapSandboxes` for cron, `engineStats` for diagnostics), and the two small shapers the class
// uses (a native build status as the contract's `SandboxBuild`, a native log line to the host's
// logger).

const { reapSandboxes: nativeReap, engineStats: nativeEngineStats } = require('./loader.js')
const { translated } = require('./errors.js')

/** @typedef {import('../index.d.ts').SandboxBuild} SandboxBuild */

/**
 * @param {import('../binding').NativeBuild} b
 * @returns {SandboxBuild}
 */
function shapeBuild(b) {
  return {
    status: /** @type {SandboxBuild['status']} */ (b.status),
    reason: b.reason ?? null,
    metadata: b.metadata ?? null,
  }
}

function forward(logger, line) {
  let ev
  try {
    ev = JSON.parse(line)
  } catch {
    return
  }
  const fn = logger[ev.level] ?? logger.info
  if (typeof fn !== 'function') return
  try {
    fn.call(logger, ev.message, ev.meta)
  } catch {
    // A throwing logger must not break the provider.
  }
}

/**
 * Removes sandboxes of one namespace that have been stopped for longer than `olderThanMinutes`
 * (default 7200), without a provider: what the `reap` command runs.
 */
async function reapSandboxes(options = {}) {
  const removed = await translated(() =>
    nativeReap({
      namespace: options.namespace,
      dockerHost: options.dockerHost,
      olderThanMinutes: options.olderThanMinutes,
      dryRun: options.dryRun,
    }),
  )
  return { removed }
}

/**
 * Counts of what this process holds for one engine (background tasks, lock and cache entries),
 * for tests and diagnostics; null when the process has not connected to that engine.
 */
function engineStats(dockerHost) {
  return nativeEngineStats(dockerHost ?? null)
}

module.exports = { reapSandboxes, engineStats, shapeBuild, forward }
