'use strict'

// Runs the fault files in name order (f1 … f8), so a run reads the same every time.
const Sequencer = require('@jest/test-sequencer').default

class ByName extends Sequencer {
  sort(tests) {
    return [...tests].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))
  }
}

module.exports = ByName
